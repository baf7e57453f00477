"""A rank that stops on a signal of its own leaves word of it where the other ranks can read.

A `kill` of one rank, or a Ctrl-C in one terminal of a hand launch, may reach one rank alone
while rank 0 works on (the data stages of `kiln run`): that rank stops cleanly, and rank 0
meets its absence only at its next collective, a lost rank, which gloo's words call "a remote
worker crashing". So the stopping rank sets a key in the rendezvous store (held by rank 0 in
a hand launch, by torchrun's agent under torchrun; `init_distributed` keeps it: torch gives
the default group's store only by a private function), and a rank that meets a lost one
reads the keys and names the rank and the signal it stopped on. Both happen in `shutdown`,
the last moment the store is there (`on_the_way_out`), under keys of this launch attempt
(torchrun keeps its store over restarts). The store dies with its host
(torchrun's agent, or rank 0 of a hand launch), and every call on a store gone prints pages
of C++ frames before its error: a rank whose launcher was killed (`die_with_launcher`), or
whose store's port no longer takes a connection, leaves the store alone; a store whose host
dies between that check and the call (its port still open a moment after its connections
reset) fails the call, whose C++ log is then left out (`connect_log.native_log_held`).
"""

from __future__ import annotations

import os
import re
import socket
import time
from datetime import timedelta

import torch.distributed as dist

from kiln.errors import MainRankInterrupted, Terminated, TrainingInterrupted
from kiln.out_of_memory import out_of_memory, refused_allocation
from kiln.parallel.connect_log import native_log_held

_KEY = "stopped/{}"
_ANY = "stopped/any"  # one look for a failing rank, not one per rank (thousands of ranks)
_WAIT = timedelta(seconds=5)  # on the way out: a store that does not answer is not waited for
_read: dict[int, str] = {}  # what the other ranks said, read before the store went
_kept: dist.Store | None = None  # the rendezvous store, under a prefix of Kiln's
_launcher: int | None = None  # torchrun's agent: this rank's parent, the store's host


def keep_store(store: dist.Store | None, launcher: int | None = None) -> None:
    """The store the ranks met in (`init_distributed` makes it), kept for the words here;
    None when the process group goes. A group made otherwise (a test's own) has none: a
    rank's word is then not left, nor read. `launcher`: the pid of torchrun's agent, the
    parent whose end takes the store with it (on its node, the store's host); once it has
    gone, the store is not asked."""
    global _kept, _launcher
    _kept, _launcher = store, launcher


def on_the_way_out(e: BaseException) -> None:
    """Before the process group goes, with `e` ending this rank: a stop on a signal of its
    own leaves word (not one rank 0 told of, nor training's, which every rank agreed on);
    anything else (a lost rank among them) reads the others' words."""
    global _read
    store = _store()
    if store is not None:
        try:
            store.set_timeout(_WAIT)
        except RuntimeError:
            return
    if isinstance(e, KeyboardInterrupt) and \
            not isinstance(e, (MainRankInterrupted, TrainingInterrupted)):  # told, agreed
        leave_word(f"stopped on {e.signal_name}" if isinstance(e, Terminated)
                   else "was interrupted (Ctrl-C or SIGINT)")
        return
    if out_of_memory(e):  # said once for the ranks that ran out (`kiln.cli`)
        leave_word(f"{RAN_OUT} ({refused_allocation(e)})")
        time.sleep(_RAN_OUT_TOGETHER_S)
    _read = stopped_ranks()
    if out_of_memory(e):
        _decide_who_says_it()


RAN_OUT = "ran out of memory"
# ranks of one launch run out at about the same step: a moment for each to leave its word
_RAN_OUT_TOGETHER_S = 1.0
_SAID = "ran_out/said"  # counted up by each rank that would say it: the first one does
_said_before = False  # another rank had said it, for the ranks, as this one left


def _decide_who_says_it() -> None:
    """This rank ran out, and no lower rank that ran out had left word as it read the
    others' words: it says so for the ranks, unless another did first. A rank that runs out
    after the others' line was said (a longer step's work before its next collective)
    would find itself the lowest then, and say it again, naming itself with them."""
    global _said_before
    me = dist.get_rank()
    store = _store()
    if store is None or any(r < me and how.startswith(RAN_OUT) for r, how in _read.items()):
        return
    try:
        with _store_may_be_gone():
            _said_before = store.add(_SAID, 1) > 1
    except RuntimeError:  # the store went with its host: this rank says it
        pass


def said_by_another() -> bool:
    """Whether another rank had said for the ranks that they ran out of memory as this one,
    which ran out too, left (it then says nothing)."""
    return _said_before


def ran_out_too() -> list[int]:
    """The other ranks that left word that they ran out of memory."""
    return sorted(r for r, how in stopped_ranks().items() if how.startswith(RAN_OUT))


def _store() -> dist.Store | None:
    if _kept is None or not dist.is_initialized() or _launcher_gone() or not _answers(_kept):
        return None
    return _kept


def _launcher_gone() -> bool:
    """This rank's torchrun was killed, so the store is known gone without a call on it (a
    store's failed call logs a C++ stack, each rank its own, before its error): the kernel
    gave this rank another parent, or is ending torchrun's threads. The kernel's SIGTERM
    (`die_with_launcher`) comes as torchrun's main thread ends, which hands its children to
    another of its threads, not yet ended: getppid() names torchrun until its last thread has
    gone (on a loaded machine, long after), while its store no longer answers, then resets
    its connections."""
    if _launcher is None:
        return False
    return os.getppid() != _launcher or _ending(_launcher)


def _ending(pid: int) -> bool:
    """Whether process `pid` is on its way out: its main thread has exited (a zombie while
    its other threads end). Where /proc cannot say (not Linux), False."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X", "x")


def _answers(store: dist.Store) -> bool:
    """Whether the TCP store under `store` still takes a connection: a plain socket's
    refusal is silent where the store's own call logs a C++ stack (its host was rank 0 of a
    hand launch, killed; or another node's torchrun). Another kind of store answers."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return True
    try:
        with socket.create_connection((store.host, store.port), timeout=_WAIT.total_seconds()):
            return True
    except OSError:
        return False


def _store_may_be_gone():
    """Around calls on a store whose host may have died since `_answers` (a killed rank 0's
    port takes a connection a moment after its store's connections reset): a failed call's
    C++ log (~25 lines of frames) is left out; any other output is written back."""
    return native_log_held(lambda e: True)


def leave_word(how: str) -> None:
    """Say in the store that this rank stops, and how ("stopped on SIGTERM")."""
    store = _store()
    if store is None:
        return
    try:
        with _store_may_be_gone():
            store.set(_KEY.format(dist.get_rank()), how)
            store.set(_ANY, "1")
    except RuntimeError:  # the store went with its host: nobody is left to read it
        pass


def stopped_ranks() -> dict[int, str]:
    """The other ranks that left word that they stopped, and how (read before the process
    group went, if it has)."""
    store, said = _store(), {}
    if store is None:
        return dict(_read)
    try:
        with _store_may_be_gone():
            if not store.check([_ANY]):
                return said
            for rank in range(dist.get_world_size()):
                key = _KEY.format(rank)
                if rank != dist.get_rank() and store.check([key]):
                    said[rank] = store.get(key).decode()
    except RuntimeError:  # the store is gone too: say what was read
        pass
    return said


def lost_rank_said(e: BaseException) -> str:
    """The error that met a lost rank, in a few words: gloo's first sentence, without the
    source path it starts with ("Connection closed by peer [127.0.0.1]:13733")."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0])
    return first.split(". ", 1)[0][:200]
