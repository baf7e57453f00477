"""Outside training, SIGTERM stops a command as Ctrl-C does: by an exception at once.

A scheduler (SLURM, a preemption) sends SIGTERM to every process of a job; Python's default
would end each at once, without a word or its exit code of a handled stop, in the middle of
the data stages. Raised as `Terminated` (a KeyboardInterrupt), it unwinds as Ctrl-C does:
prepare keeps its finished tasks, tokenizer and tokenize replace their outputs only when
complete, and `kiln` says one line and exits 143. Training takes both signals over with its
own handlers (`kiln.train.stop_signals`: a stop at the next step boundary) and gives them
back after.

Once a stop is under way (`stop_under_way`), a SIGTERM again (torchrun's, to every rank once
one rank has exited) and a second SIGINT within `REPEAT_WINDOW_S` (the forwarded copy of a
terminal's Ctrl-C) are the same stop: raised again, they would cut short the unwinding, and
in the interpreter's exit they would end the process as killed by SIGTERM (torchrun then
names a rank that stopped cleanly as killed).
"""

from __future__ import annotations

import atexit
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kiln.errors import Terminated

REPEAT_WINDOW_S = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


_under_way = False


def what_stops_at_once(signum: int) -> str:
    """What ends a stop under way at once, said when signal `signum` began it: a second
    Ctrl-C, never a repeated SIGTERM (a scheduler's or torchrun's: the same stop). After a
    SIGTERM, "Ctrl-C again" would name a key nobody pressed, and promise it of a `kill`."""
    if signum == signal.SIGTERM:
        return "a second SIGTERM is the same stop; Ctrl-C or SIGINT stops at once"
    return "Ctrl-C again to stop at once"


def stop_under_way() -> None:
    """Say that this process is stopping on a signal (raised here, or training's stop): a
    SIGTERM from now on, to the end of the interpreter's exit, is ignored."""
    global _under_way
    if not _under_way:
        _under_way = True
        atexit.register(_ignore_sigterm)  # the handlers are restored when `kiln` returns


def _ignore_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _StopAtOnce:
    def __init__(self) -> None:
        self.first_at: float | None = None

    def handle(self, signum: int, frame: object = None) -> None:
        now = time.monotonic()
        if signum == signal.SIGTERM and _under_way:
            return  # the stop under way
        if self.first_at is not None and now - self.first_at <= REPEAT_WINDOW_S:
            return  # the same Ctrl-C, forwarded
        if self.first_at is None:
            self.first_at = now
        stop_under_way()
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def signals_stop_at_once() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt`, once per
    stop; a signal ignored (`nohup`, a background job) stays ignored. Only the main thread
    may take signals over: elsewhere this does nothing."""
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
