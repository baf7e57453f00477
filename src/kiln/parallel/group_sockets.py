"""A gloo group's connections to the other ranks, watched from the OS: whether one has closed.

gloo fails every receive on a connection that ends (a rank killed), but not every send: one
whose write met the connection already ended by its peer (the rank killed a moment before,
its end not yet read here) is queued for a later write, and when gloo then reads the end it
fails the connection's receives and the sends still waiting for their receiver, not that one
(`Pair::signalException` passes over the queued writes of unbound buffers). Its wait lasts
the group's timeout, the long-wait group's week, deaf to signals: rank 0 telling the others
that a checkpoint is written as rank 1 is killed (tests/distributed/test_killed_while_told).
gloo closes the socket of a connection it found ended, so a wait on the group (`rank_waits`)
watches the sockets it was made with.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_CHECK_S = 1.0  # a wait looks at most this often: one fstat per connection


def _sockets() -> dict[int, tuple[int, int]]:
    """This process's open sockets: fd -> (device, inode); none where fds cannot be listed."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # not Linux: nothing is watched, the waits are as before
        return {}
    found = {}
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:  # the listing's own fd, or one closed since
            continue
        if stat.S_ISSOCK(st.st_mode):
            found[fd] = (st.st_dev, st.st_ino)
    return found


def _connected(fd: int, skip_port: int | None) -> bool:
    """A connection (not a listening socket), other than one to or from the rendezvous store
    made meanwhile (its port `skip_port`: rank 0 of a hand launch hosts it, torchrun's agent
    otherwise)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            return skip_port not in (s.getpeername()[1], s.getsockname()[1])
    except (OSError, IndexError, TypeError):  # not connected, or not an inet socket
        return False


class Connections:
    """The sockets of the connections a group was made with (`made`), and whether one of
    them has closed since: gloo closes a connection's socket only when it ends."""

    def __init__(self, sockets: dict[int, tuple[int, int]]):
        self._sockets = sockets
        self._looked = 0.0
        self._closed = False

    def closed(self) -> bool:
        """Whether a connection has closed (looked at most once every `_CHECK_S`)."""
        if self._closed or time.monotonic() - self._looked < _CHECK_S:
            return self._closed
        self._looked = time.monotonic()
        for fd, ident in self._sockets.items():
            try:
                st = os.fstat(fd)
                self._closed = (st.st_dev, st.st_ino) != ident  # its fd taken by another file
            except OSError:
                self._closed = True
            if self._closed:
                break
        return self._closed


def made(make: Callable[[], T], skip_port: int | None = None) -> tuple[T, Connections]:
    """`make()` (a group made), and the connections it opened: the sockets connected while
    it ran (the group's own listening socket left out)."""
    before = _sockets()
    made_now = make()
    new = {fd: ident for fd, ident in _sockets().items() if before.get(fd) != ident}
    return made_now, Connections({fd: ident for fd, ident in new.items()
                                  if _connected(fd, skip_port)})
