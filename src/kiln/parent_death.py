"""The processes a `kiln prepare` starts end with it, even when it is killed outright.

A prepare with several workers runs datatrove's pool beside a manager process forked from
it, and the pool's workers are forks of multiprocess's fork server. SIGKILLed (by hand, by
the OOM killer), the parent left them all behind: the manager waited on a futex forever,
which kept the fork server from seeing its parent go, and the workers ran their tasks to
the end only to fail writing the result. Linux's PR_SET_PDEATHSIG asks for a SIGTERM when a
process's parent exits: set in each fork of the prepare (the manager) and in each pool
worker, the manager goes with the prepare, the fork server then sees its last client gone
and exits, and the workers go with it. SIGKILL, not SIGTERM: a fork keeps the prepare's
Python handlers, and Kiln's SIGTERM handler stops work at a boundary, which the manager
never reaches. A worker's task left unfinished is run again by the next prepare, as after
any kill. Elsewhere than Linux nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator

_PR_SET_PDEATHSIG = 1
_forks_die: list[int] = []  # the pid whose forks die with it, while it runs a prepare
_hooked = False


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent exits (a parent gone already,
    as the request was made, ends it now)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it exited before the request took
            os.kill(os.getpid(), signal.SIGKILL)


def _after_fork_in_child() -> None:
    if _forks_die and os.getppid() == _forks_die[-1]:  # a fork of the prepare, not of a fork
        _forks_die.clear()  # its own forks are not asked for
        die_with_parent()


@contextlib.contextmanager
def forks_die_with_this_process() -> Iterator[None]:
    """Inside: each process forked from this one dies when this one exits."""
    global _hooked
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _hooked = True
    _forks_die.append(os.getpid())
    try:
        yield
    finally:
        _forks_die.pop()
