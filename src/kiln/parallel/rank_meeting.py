"""The ranks meet (their rendezvous store made, then each rank's arrival) in a Python wait,
which takes Ctrl-C and SIGTERM.

torch's env:// rendezvous waits in C++: rank 0 of a hand launch in its store's constructor
until every rank has connected, the others in a connect retried for the group's timeout
(30 min), and neither runs a signal's handler meanwhile (a Ctrl-C only cut a retry's sleep
short, in C++ frames). A rank 0 refused before it joined (the run's training lock) left the
others deaf for that half hour. Here the store is made without waiting for anyone; every
rank then says it is here and waits for the others in short polls. A rank stopped while it
waits leaves word, and the ranks waiting with it stop too; rank 0 of a hand launch that
failed before the ranks met makes the store then, to say so to the ranks that wait for it
(`tell_the_waiting`). A wait longer than a start-up is said, and bounded by the timeout.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import torch.distributed as dist

from kiln.config import ConfigError
from kiln.errors import KilnError, MainRankInterrupted, Terminated
from kiln.parallel.connect_log import native_log_held

_SAY_AFTER_S = 30.0  # longer than ranks started together take to meet (importing torch)
_POLL_MAX_S = 0.5
_TELL_S = 5.0  # the host, stopping as the ranks meet, waits this long for them to hear it
_met = False  # this process made (or reached) the ranks' store


def meet(timeout: timedelta) -> dist.Store:
    """The store the ranks meet in (torchrun's agent's, or rank 0's in a hand launch), once
    every rank has reached it: `init_process_group` on it then finds them all at once."""
    global _met
    addr, port, rank, world = _where()
    agent = _agent_store()
    hosts = rank == 0 and not agent
    deadline = time.monotonic() + timeout.total_seconds()
    if not hosts:
        _wait_for_the_host(addr, port, rank, deadline)
    try:
        store = dist.TCPStore(addr, port, world_size=world, is_master=hosts, timeout=timeout,
                              wait_for_workers=False, multi_tenant=not agent,
                              use_libuv=os.environ.get("USE_LIBUV", "1") == "1")
    except KeyboardInterrupt as e:  # taken as its connect returned, before the wait's words
        if not hosts:
            _leave_word_anew(addr, port, rank, world, e)
        raise
    _met = True
    _all_here(dist.PrefixStore(_meeting(), store), rank, world, deadline, f"{addr}:{port}",
              hosts)
    return store


def _agent_store() -> bool:
    """torchrun's agent hosts the store: every rank is its client."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _where() -> tuple[str, int, int, int]:
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise ConfigError(f"WORLD_SIZE={os.environ.get('WORLD_SIZE')} is set but "
                          f"{' and '.join(missing)} not: set them to rank 0's host and a free "
                          "port on every rank, or start the ranks with torchrun")
    try:
        port = int(os.environ["MASTER_PORT"])
    except ValueError:
        raise ConfigError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} is not a port number") \
            from None
    return os.environ["MASTER_ADDR"], port, int(os.environ["RANK"]), \
        int(os.environ["WORLD_SIZE"])


def launch_attempt() -> str:
    """This launch and attempt, for the keys Kiln leaves in the ranks' store: torchrun's
    agent keeps its store over its restarts of the workers, so an earlier attempt's keys are
    there still (its meeting's count, a rank's word that it ran out of memory)."""
    return (f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")


def _meeting() -> str:
    """The keys of this launch's meeting."""
    return f"kiln/meeting/{launch_attempt()}/"


def _wait_for_the_host(addr: str, port: int, rank: int, deadline: float) -> None:
    """Until rank 0's store takes a connection: a plain socket's try, refused in silence,
    where the store's own connect retries in C++ (deaf to signals, each refusal logged)."""
    wait = _Wait(deadline)
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            pass
        if wait.over():
            raise KilnError(f"rank {rank} waited {wait.seconds():.0f} s for rank 0 at {addr}:"
                            f"{port} (MASTER_ADDR:MASTER_PORT) and gave up: {_LIKELY}")
        if wait.time_to_say():
            print(f"kiln: rank {rank} waits for rank 0 at {addr}:{port} (MASTER_ADDR:"
                  f"MASTER_PORT) for {wait.seconds():.0f} s: {_LIKELY}; Ctrl-C stops it",
                  file=sys.stderr, flush=True)
        wait.pause()


class _Wait:
    """One wait of the meeting: polls that back off from 10 ms to _POLL_MAX_S, a line said
    once past _SAY_AFTER_S (a late rank is named, not waited on in silence), the deadline.
    (rank_waits polls a collective under way, another kind of wait.)"""

    def __init__(self, deadline: float):
        self.started, self.deadline, self.said, self.next = time.monotonic(), deadline, False, 0.01

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def time_to_say(self) -> bool:
        """True once: the first time the wait has run past _SAY_AFTER_S."""
        if self.said or self.seconds() <= _SAY_AFTER_S:
            return False
        self.said = True
        return True

    def pause(self) -> None:
        time.sleep(self.next)
        self.next = min(2 * self.next, _POLL_MAX_S)


_LIKELY = ("rank 0 has not started, or stopped before it joined (its output says why), or "
           "the ranks were given different MASTER_ADDR / MASTER_PORT")


def _all_here(store: dist.Store, rank: int, world: int, deadline: float, where: str,
              hosts: bool) -> None:
    """Say this rank is here, then wait in short polls until every rank is; stopped (Ctrl-C,
    SIGTERM), leave word, which stops the others; a rank's word stops this one. The host
    (rank 0 of a hand launch) stays until the ranks waiting with it have read the word; on
    the others a store gone with its host fails the poll without its C++ log."""
    try:
        _wait_for_all(store, rank, world, deadline, where, hosts)
    except (KeyboardInterrupt, KilnError):
        if hosts and store.check(["left"]):
            _linger(store)
        raise


def _wait_for_all(store: dist.Store, rank: int, world: int, deadline: float, where: str,
                  hosts: bool) -> None:
    wait, counted = _Wait(deadline), False
    held = nullcontext if hosts else _store_may_be_gone
    try:
        with held():
            _refuse_another_launch(store, rank, world, hosts, deadline)
            store.set(f"here/{rank}", "1")
            here, counted = store.add("here", 1), True
        while here < world:
            with held():
                if store.check(["left"]):
                    _stop_as_told(store)
            if wait.over():
                with held():
                    missing = [r for r in range(world) if not store.check([f"here/{r}"])]
                raise KilnError(f"rank {rank} waited {wait.seconds():.0f} s at {where} for "
                                f"{_ranks(missing)} of {world}, which never came: they did not "
                                "start, or stopped before they joined (their output says why)")
            if wait.time_to_say():
                print(f"kiln: rank {rank} waits at {where} for {world - here} of the {world} "
                      f"ranks to join, for {wait.seconds():.0f} s; Ctrl-C stops it",
                      file=sys.stderr, flush=True)
            wait.pause()
            with held():
                here = store.add("here", 0)
    except KeyboardInterrupt as e:
        if not isinstance(e, MainRankInterrupted):  # its own stop: the others stop with it
            _leave_word(store, rank, e, counted)
        raise


def _refuse_another_launch(store: dist.Store, rank: int, world: int, hosts: bool,
                           deadline: float) -> None:
    """A rank whose WORLD_SIZE or RANK does not fit the others' (a hand launch's typo) was
    counted as here: the count reached, the ranks went on into the group's C++ connect, each
    waiting there for a rank that never came, deaf to SIGTERM, for the group's half hour.
    The meeting's WORLD_SIZE is its host's (rank 0 of a hand launch, whose MASTER_ADDR the
    others were given), or under torchrun's agent the first rank's (torchrun gives each the
    same); a rank that does not fit leaves word (which stops the ranks waiting) and fails
    with the reason. Not the first rank's in a hand launch: which rank that was depended on
    their start-ups (a rank polling rank 0's port may reach the store just made before rank
    0 itself, on a loaded node), and so did which rank was refused."""
    if hosts or _agent_store():
        first = store.compare_set("world", "", str(world)).decode()
    else:
        first = _hosts_world(store, rank, deadline)
    why = None
    if first != str(world):
        why = f"was started with WORLD_SIZE={world}, another rank of this launch with {first}"
    elif not 0 <= rank < world:
        why = f"is out of range: RANK must be 0 to {world - 1} (WORLD_SIZE={world})"
    elif store.add(f"rank/{rank}", 1) > 1:
        why = "was started twice: each rank of a launch needs a RANK of its own"
    if why is None:
        return
    try:
        store.set("left", json.dumps([rank, False, 1, why]))
    except RuntimeError:  # the store went with its host: nobody waits on it
        pass
    raise ConfigError(f"rank {rank} {why}: start every rank with the same WORLD_SIZE and "
                      "MASTER_ADDR / MASTER_PORT, or start the ranks with torchrun")


def _hosts_world(store: dist.Store, rank: int, deadline: float) -> str:
    """The WORLD_SIZE rank 0 of a hand launch gave its store, set as it made it: waited for
    in short polls (a signal's handler runs), a word left meanwhile (rank 0 stopped) obeyed."""
    wait = _Wait(deadline)
    while not store.check(["world"]):
        if store.check(["left"]):
            _stop_as_told(store)
        if wait.over():
            raise KilnError(f"rank {rank} waited {wait.seconds():.0f} s for rank 0 to start "
                            f"the meeting in its store and gave up: {_LIKELY}")
        wait.pause()
    return store.get("world").decode()


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{', ...' if len(ranks) > 8 else ''}"


def _leave_word(store: dist.Store, rank: int, e: KeyboardInterrupt, counted: bool) -> None:
    how = f"stopped on {e.signal_name}" if isinstance(e, Terminated) else \
        "was interrupted (Ctrl-C or SIGINT)"
    try:
        if counted:  # no longer one of the ranks that read the word (`_linger`)
            store.add("here", -1)
        store.set("left", json.dumps([rank, True, getattr(e, "exit_code", 130), how]))
    except RuntimeError:  # the store went with its host: nobody waits on it
        pass


def _leave_word_anew(addr: str, port: int, rank: int, world: int, e: KeyboardInterrupt) -> None:
    """A rank stopped while its end of the store was made (a signal waits for the connect,
    slow on a loaded node, and is taken as it returns, the store then dropped): it leaves
    word on a connection of its own, or the ranks waiting with it waited for it until the
    meeting's timeout."""
    try:
        with _store_may_be_gone():
            store = dist.TCPStore(addr, port, world_size=world, is_master=False,
                                  timeout=timedelta(seconds=5), wait_for_workers=False)
            _leave_word(dist.PrefixStore(_meeting(), store), rank, e, counted=False)
    except RuntimeError:  # the store went with its host: nobody waits on it
        pass


def _store_may_be_gone():
    """Around a waiting rank's call on the store, whose host may have stopped meanwhile:
    the call's failure (said as a lost rank) without its C++ log (~25 lines of frames)."""
    return native_log_held(lambda e: True)


def _linger(store: dist.Store) -> None:
    """The host, stopping on a rank's word (or its own): its store goes with it, so it waits
    (a few seconds at most) for the ranks that wait with it to read the word, as
    `tell_the_waiting` does; they failed on the store's loss, in other words."""
    until = time.monotonic() + _TELL_S  # the rank that left word is counted in neither
    while time.monotonic() < until and store.add("told", 0) < store.add("here", 0):
        time.sleep(0.05)


def _stop_as_told(store: dist.Store) -> None:
    """Stop as the rank that left word did: interrupted with its status, or failed."""
    rank, interrupted, code, how = json.loads(store.get("left"))
    store.add("told", 1)
    if not interrupted:  # `tell_the_waiting`: rank 0 failed
        raise KilnError(f"rank {rank} {how}")
    raise MainRankInterrupted(f"rank {rank} {how} before the ranks met", code)


def tell_the_waiting(e: BaseException) -> None:
    """A rank of a hand launch failed (`e`) before the ranks met, in a command they meet
    for (a check of the settings or the run that failed on it alone): the others wait for
    it until the timeout (half an hour). Rank 0 makes its store now, leaves word of `e`,
    and waits a start-up's time at most for the other ranks to read it (those started with
    it poll its port); another rank leaves its word in rank 0's store, if rank 0 hosts it
    within that time (rank 0 waiting for it there stops with it). A rank that
    failed too reads the word (or leaves its own) and is counted (as refused), so ranks that
    all failed alike end at once. Under torchrun its agent stops the others."""
    if _met or "RANK" not in os.environ or "TORCHELASTIC_RUN_ID" in os.environ or \
            int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    try:
        addr, port, rank, world = _where()
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        word = json.dumps([rank, False, 1, f"failed before the ranks met: {first}"])
        # the others may be a start-up behind (importing torch on a loaded node)
        until = time.monotonic() + _SAY_AFTER_S
        if rank != 0:
            _word_to_rank_zero(addr, port, world, word, until)
            return
        store = dist.PrefixStore(_meeting(), dist.TCPStore(
            addr, port, world_size=world, is_master=True, timeout=timedelta(seconds=5),
            wait_for_workers=False, multi_tenant=True))
        store.compare_set("left", "", word)
        while store.add("told", 0) + store.add("refused", 0) < world - 1 and \
                time.monotonic() < until:
            time.sleep(0.05)
    except (RuntimeError, ValueError, KilnError, KeyboardInterrupt):
        pass  # no store to be had (the port taken, rank 0 gone), or stopped: as before


def _word_to_rank_zero(addr: str, port: int, world: int, word: str, until: float) -> None:
    """A failed rank past 0 leaves `word` in rank 0's store once it takes a connection
    (before `until`): kept where rank 0 left its own first."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                break
        except OSError:
            if time.monotonic() > until:
                return  # rank 0 has not come: it says it waits, once past _SAY_AFTER_S
            time.sleep(0.05)
    with _store_may_be_gone():
        store = dist.PrefixStore(_meeting(), dist.TCPStore(
            addr, port, world_size=world, is_master=False, timeout=timedelta(seconds=5),
            wait_for_workers=False, multi_tenant=True))
        store.compare_set("left", "", word)
        # counted apart from the ranks told: a host that stops on it (`_linger`) waits for
        # those that are here, this rank not among them
        store.add("refused", 1)
