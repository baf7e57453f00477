"""group_sockets: a group's connections are the sockets connected while it was made, and one
of them closing (gloo closes a connection's socket when it ends) is seen."""

from __future__ import annotations

import os
import socket

import pytest

from kiln.parallel import group_sockets
from kiln.parallel.group_sockets import made

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux's /proc")


def _connection(port: int | None = None) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listening socket and the two ends of a connection to it, as a group's device makes."""
    listener = socket.create_server(("127.0.0.1", port or 0))
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    return listener, near, far


@pytest.fixture(autouse=True)
def every_look(monkeypatch):
    monkeypatch.setattr(group_sockets, "_CHECK_S", 0.0)


def test_a_closed_connection_is_seen_and_a_listening_socket_is_not_watched():
    (listener, near, far), links = made(_connection)
    try:
        assert not links.closed()
        listener.close()  # a group's listening socket may go once its ranks are connected
        assert not links.closed()
        far.close()
        assert links.closed()
    finally:
        near.close()


def test_a_closed_socket_whose_fd_is_taken_by_another_is_seen():
    (listener, near, far), links = made(_connection)
    fd = far.fileno()
    far.close()
    other = socket.socket()  # takes the lowest free fd: the closed one's
    try:
        assert other.fileno() == fd
        assert links.closed()
    finally:
        for s in (listener, near, other):
            s.close()


def test_a_connection_to_or_from_the_store_made_meanwhile_is_not_the_groups():
    """Rank 0 of a hand launch hosts the rendezvous store, torchrun's agent otherwise: a
    connection it accepts while the group is made (its local port the store's), or one a
    rank opens to it (its peer's port the store's), is not the group's (gloo connects
    ranks' own listening ports) and may close."""
    port = socket.create_server(("127.0.0.1", 0))
    store_port = port.getsockname()[1]
    port.close()
    (listener, near, far), links = made(lambda: _connection(store_port), skip_port=store_port)
    try:
        far.close()  # the store's end: not watched
        assert not links.closed()
        near.close()  # a rank's connection to the store: not watched either
        assert not links.closed()
    finally:
        listener.close()
