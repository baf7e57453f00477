"""datatrove's local executor with its task logs kept in their files, off the console, and its
progress bars shown only when Kiln's are.

Each datatrove task logs its pipeline, per-step statistics and file reads to the console
and to `logs/task_*.log`; on the quickstart that is ~180 lines before Kiln's own summary.
Here a task's console sink only shows errors (datatrove's own switch: a task whose local
rank is not 0 logs errors alone), the executor's closing statistics stay off it too, and
the files keep everything. Progress bars (the reader's) are not logs and still show, unless
Kiln's progress is off (`run_prepare(progress=False)`): then datatrove's own bars (exact
dedup's, MinHash's, which take no switch) are turned off in every task too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

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


@contextmanager
def progress_bars_off() -> Iterator[None]:
    """Every tqdm bar made meanwhile in this process is disabled: datatrove's dedup steps
    make theirs without a `disable` argument to pass."""
    from tqdm import std

    made = std.tqdm.__init__

    def disabled(self, *args, **kwargs) -> None:
        kwargs["disable"] = True
        made(self, *args, **kwargs)

    std.tqdm.__init__ = disabled
    try:
        yield
    finally:
        std.tqdm.__init__ = made


class KilnLocalExecutor(LocalPipelineExecutor):
    """The local executor, its tasks' console logs (`quiet`: in the log files alone) and
    progress bars (`progress`) as Kiln's settings say. The bars are turned off in the task
    itself: a task may run in another process (datatrove's pool), which patches made here
    never reach."""

    def __init__(self, pipeline, *args, quiet: bool = True, progress: bool = True, **kwargs):
        super().__init__(pipeline, *args, **kwargs)
        self.quiet, self.progress = quiet, progress

    def run(self):
        with quiet_console() if self.quiet else nullcontext():
            return super().run()

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        with nullcontext() if self.progress else progress_bars_off():
            if not self.quiet:
                return super()._run_for_rank(rank, local_rank, node_rank)
            try:
                return super()._run_for_rank(rank, local_rank + 1, node_rank)
            finally:  # datatrove re-adds its console sink after a task (one run in this process)
                _console_for_warnings()
