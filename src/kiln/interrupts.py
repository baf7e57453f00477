"""Outside training, SIGTERM and SIGHUP stop a command as Ctrl-C does: by an exception at once.

A scheduler (SLURM, a preemption) sends SIGTERM to every process of a job; Python's default
would end each at once, without a word or its exit code of a handled stop, in the middle of
the data stages. Raised as `Terminated` (a KeyboardInterrupt), it unwinds as Ctrl-C does:
prepare keeps its finished tasks, tokenizer and tokenize replace their outputs only when
complete, and `kiln` says one line and exits 143. Training takes the signals over with its
own handlers (`kiln.train.stop_signals`: a stop at the next step boundary) and gives them
back after.

SIGHUP is the same stop (exit status 129): a terminal closed, or an ssh session dropped,
while `kiln` ran in its foreground without `nohup` or tmux. Its default would end training
at once and lose every step since the last periodic checkpoint; the user did not ask to
lose them, only lost the terminal (whose writes now fail with EIO: `kiln.closed_streams`
sends them to os.devnull). A SIGHUP ignored (`nohup`) stays ignored, as any stop signal.

Once a stop is under way (`stop_under_way`), a SIGTERM or SIGHUP again (torchrun's, to
every rank once one rank has exited) and a second SIGINT within `REPEAT_WINDOW_S` (the
forwarded copy of a terminal's Ctrl-C) are the same stop: raised again, they would cut short
the unwinding, and in the interpreter's exit they would end the process as killed by that
signal (torchrun then names a rank that stopped cleanly as killed).

A signal reaches its handler only when the main thread runs Python: native work that holds
the main thread (HF tokenizers' BPE training, minutes on a large corpus) would hold the stop
back until it returns. `taking_signals` runs such work in a thread of its own while the main
thread waits in short joins, so the stop comes at once.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kiln.errors import Terminated

REPEAT_WINDOW_S = 1.0
_JOIN_S = 0.05  # how often the main thread, waiting on native work, lets a handler run
# SIGHUP where the platform has it (POSIX)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM,
                *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


_under_way = False


def what_stops_at_once(signum: int) -> str:
    """What ends a stop under way at once, said when signal `signum` began it: a second
    Ctrl-C, never a repeated SIGTERM or SIGHUP (a scheduler's, torchrun's: the same stop).
    After those, "Ctrl-C again" would name a key nobody pressed, and promise it of a `kill`."""
    if signum == signal.SIGINT:
        return "Ctrl-C again to stop at once"
    name = signal.Signals(signum).name
    return f"a second {name} is the same stop; Ctrl-C or SIGINT stops at once"


def stop_under_way() -> None:
    """Say that this process is stopping on a signal (raised here, or training's stop): a
    SIGTERM or SIGHUP from now on, to the end of the interpreter's exit, is ignored."""
    global _under_way
    if not _under_way:
        _under_way = True
        atexit.register(_ignore_repeats)  # the handlers are restored when `kiln` returns


def _ignore_repeats() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if sig != signal.SIGINT:
                signal.signal(sig, signal.SIG_IGN)


class _StopAtOnce:
    def __init__(self) -> None:
        self.first_at: float | None = None
        self.pid = os.getpid()

    def handle(self, signum: int, frame: object = None) -> None:
        if os.getpid() != self.pid:
            return  # a fork that kept the handler (datatrove's manager): its parent stops it
        now = time.monotonic()
        if signum != signal.SIGINT and _under_way:
            return  # the stop under way
        if self.first_at is not None and now - self.first_at <= REPEAT_WINDOW_S:
            return  # the same Ctrl-C, forwarded
        if self.first_at is None:
            self.first_at = now
        stop_under_way()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt()
        raise Terminated(signal.Signals(signum).name)


@contextmanager
def signals_stop_at_once() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise `Terminated` and SIGINT `KeyboardInterrupt`,
    once per stop; a signal ignored (`nohup`, a background job) stays ignored. Only the main
    thread may take signals over: elsewhere this does nothing."""
    global _under_way
    _under_way = False  # a command of its own (tests call `kiln.cli.main` again in-process)
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handler = _StopAtOnce().handle
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def stops_left_to_the_parent() -> None:
    """In a pool worker: SIGINT and SIGHUP ignored, SIGTERM at its default. A Ctrl-C or a
    hang-up reaches the terminal's whole process group; the parent takes it, stops, and ends
    its workers with SIGTERM (`Pool.terminate`), which must still end them. Taken here, it
    raised a traceback in each worker or ended it unseen, mid-task."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else signal.SIG_IGN)


T = TypeVar("T")


def taking_signals(work: Callable[[], T]) -> T:
    """`work()`, run in a worker thread while the main thread waits in short joins, so that
    a stop signal's exception is raised here at once rather than when native code that
    holds the main thread returns. A stop leaves the worker running, unseen, until the
    process exits: `work` must leave nothing half made (the tokenizer is trained in memory
    and saved atomically after it returns). Off the main thread, which alone takes signals,
    `work` runs in place."""
    if threading.current_thread() is not threading.main_thread():
        return work()
    done: list[Any] = []

    def run() -> None:
        try:
            done.append((True, work()))
        except BaseException as e:  # raised again in the main thread
            done.append((False, e))

    worker = threading.Thread(target=run, name="kiln-native-work", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(_JOIN_S)
    ok, value = done[0]
    if not ok:
        raise value
    return value
