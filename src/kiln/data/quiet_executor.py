"""datatrove's local executor with its task logs kept in their files, off the console.

Each datatrove task logs its pipeline, per-step statistics and file reads to the console
and to `logs/task_*.log`; on the quickstart that is ~180 lines before Kiln's own summary.
Here a task's console sink only shows errors (datatrove's own switch: a task whose local
rank is not 0 logs errors alone), the executor's closing statistics stay off it too, and
the files keep everything. Progress bars (the reader's) are not logs and still show.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from datatrove.executor import LocalPipelineExecutor
from loguru import logger


def _console_for_warnings() -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")


@contextmanager
def quiet_console() -> Iterator[None]:
    """Warnings and errors alone on the console, datatrove's default sink back afterwards:
    around an executor's run, and around Kiln's own reads of documents (`kiln tokenizer`,
    `kiln tokenize`), where datatrove's reader logs a line per file."""
    _console_for_warnings()
    try:
        yield
    finally:
        from datatrove.utils.logging import setup_default_logger

        setup_default_logger()


class QuietLocalExecutor(LocalPipelineExecutor):
    def run(self):
        with quiet_console():
            return super().run()

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        try:
            return super()._run_for_rank(rank, local_rank + 1, node_rank)
        finally:  # datatrove re-adds its console sink after a task (one run in this process)
            _console_for_warnings()
