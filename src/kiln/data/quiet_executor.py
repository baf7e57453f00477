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

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from datatrove.executor import LocalPipelineExecutor
from loguru import logger

from kiln.interrupts import STOP_SIGNALS, stops_left_to_the_parent
from kiln.parent_death import die_with_parent, forks_die_with_this_process


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


def start_helpers_deaf_to_stops() -> None:
    """Start multiprocess's resource tracker and fork server (the pool's workers are forks of
    it) with SIGINT and SIGHUP blocked, which they and the workers keep: a Ctrl-C or a hang-up
    reaches the whole process group, and the parent alone should take it. The hang-up's default
    ended both: the tracker said it "died unexpectedly" with a traceback per semaphore, and
    with the fork server gone the pool took its workers for exited and left them running,
    each failing with a traceback once its task was done. Blocked in this thread only while
    they start, the signals reach the parent's handlers after (or in another thread), never
    lost, as a moment of SIG_IGN could lose them. SIGTERM stays open: `Pool.terminate` ends
    the workers with it. Nothing happens where they already run."""
    from multiprocess import forkserver, resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        return
    deaf = {s for s in STOP_SIGNALS if s != signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, deaf)
    try:
        resource_tracker.ensure_running()  # unblocks SIGINT (and SIGTERM) after its start
        signal.pthread_sigmask(signal.SIG_BLOCK, deaf)
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class KilnLocalExecutor(LocalPipelineExecutor):
    """The local executor, its tasks' console logs (`quiet`: in the log files alone) and
    progress bars (`progress`) as Kiln's settings say. The bars are turned off in the task
    itself: a task may run in another process (datatrove's pool), which patches made here
    never reach."""

    def __init__(self, pipeline, *args, quiet: bool = True, progress: bool = True, **kwargs):
        super().__init__(pipeline, *args, **kwargs)
        self.quiet, self.progress = quiet, progress

    def run(self):
        self._parent_pid = os.getpid()
        if self.workers > 1 and self.start_method == "forkserver":
            start_helpers_deaf_to_stops()
        # the pool's manager (a fork) ends with this process, even SIGKILLed (parent_death)
        with quiet_console() if self.quiet else nullcontext(), forks_die_with_this_process():
            return super().run()

    def _launch_run_for_rank(self, rank: int, *args, **kwargs):
        if getattr(self, "_parent_pid", os.getpid()) != os.getpid():  # a pool worker's
            stops_left_to_the_parent()
            die_with_parent()  # with the fork server, which ends when the prepare does
        return super()._launch_run_for_rank(rank, *args, **kwargs)

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        with nullcontext() if self.progress else progress_bars_off():
            if not self.quiet:
                return super()._run_for_rank(rank, local_rank, node_rank)
            try:
                return super()._run_for_rank(rank, local_rank + 1, node_rank)
            finally:  # datatrove re-adds its console sink after a task (one run in this process)
                _console_for_warnings()
