"""Ctrl-C, SIGTERM and SIGHUP end training at a step boundary with a checkpoint, not mid-step.

The first SIGINT, SIGTERM or SIGHUP only sets a flag: the step in flight finishes, the
checkpoint callback saves that step and training stops with `TrainingInterrupted`, so
nothing trained since the last periodic checkpoint is lost (a scheduler's SIGTERM before
preemption is the same case, and so is a SIGHUP: the terminal of a foreground `kiln train`
closed, its ssh session dropped, where Python's default would end training at once, and
where the banner and the last lines meet a hung-up terminal: `kiln.closed_streams`). On
the last step the run is complete and saved, and still stops there (a `kiln run` does not
go on to eval and export). A second Ctrl-C stops at once, as Python's default would. Under
torchrun in a terminal each rank gets Ctrl-C twice (from the terminal and forwarded by
torchrun), so a second SIGINT within `REPEAT_WINDOW_S` of the first counts as the same
press; a repeated SIGTERM or SIGHUP (torchrun passes on what it gets, then SIGTERMs the
ranks) is the same stop.

From the first of these signals (on any rank: the ranks agree on the stop), the process is
stopping (`kiln.interrupts.stop_under_way`): a SIGTERM or SIGHUP that comes after training's
handlers are given back, as the rank leaves its process group, is the same stop, not a new
one raised in the middle of it (a killed torchrun's kernel SIGTERMs its ranks once per thread
of torchrun's that ends, on a loaded machine long after the first).

Ranks may see the signal at different steps (or only one rank may get it): `agreed` sums
the flags across ranks every step, so all of them stop after the same step and the
checkpoint's collectives line up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from kiln.interrupts import REPEAT_WINDOW_S, stop_under_way, what_stops_at_once
from kiln.interrupts import STOP_SIGNALS as _STOP_SIGNALS
from kiln.parallel.distributed import DistEnv, all_reduce_sum, is_main_process

__all__ = ["REPEAT_WINDOW_S", "StopRequests"]


class StopRequests:
    """Handlers for SIGINT, SIGTERM and SIGHUP that ask training to stop after the current
    step."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.signal: int | None = None
        self._first_at = 0.0
        self._clock = clock
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequests:
        """Take over the stop signals, unless ignored (only the main thread may)."""
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup`, a background job
                    self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def handle(self, signum: int, frame: object = None) -> None:
        now = self._clock()
        if self.signal is None:
            self.signal, self._first_at = signum, now
            stop_under_way()
            _say(f"\n{signal.Signals(signum).name}: training stops after this step and saves a "
                 f"checkpoint ({what_stops_at_once(signum)})\n")
        elif signum == signal.SIGINT and now - self._first_at > REPEAT_WINDOW_S:
            self.restore()
            raise KeyboardInterrupt
        # a repeated SIGTERM or SIGHUP (torchrun's shutdown) or the forwarded copy of Ctrl-C:
        # stopping

    def agreed(self, env: DistEnv, device: torch.device) -> str | None:
        """The signal's name when any rank was asked to stop, the same on every rank."""
        if not env.distributed:
            return None if self.signal is None else signal.Signals(self.signal).name
        # a rank told to terminate outranks a hang-up elsewhere, and either a Ctrl-C: the
        # exit status says the stronger cause
        asked, terminate, hangup = all_reduce_sum(self._flags(device), env).tolist()
        if not asked:
            return None
        stop_under_way()  # another rank's signal: this rank stops on it too
        return "SIGTERM" if terminate else "SIGHUP" if hangup else "SIGINT"

    def _flags(self, device: torch.device) -> torch.Tensor:
        """(asked to stop, by SIGTERM, by SIGHUP), to be summed across ranks."""
        return torch.tensor([self.signal is not None, self.signal == signal.SIGTERM,
                             self.signal == _SIGHUP], dtype=torch.float32, device=device)


_SIGHUP = getattr(signal, "SIGHUP", None)  # POSIX


def _say(text: str) -> None:
    """Write from inside a signal handler: os.write does not re-enter a buffered stream the
    interrupted code may be in the middle of writing to (the progress bar's)."""
    if not is_main_process():
        return
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError, AttributeError):  # stderr replaced by one without a descriptor
        pass
