"""Work that some ranks do while the others wait, ended alike on every rank: rank 0's
alone (data stages, a checkpoint write: `run_on_main`), or every rank's where it may fail
on some alone (each rank's own copy of a checkpoint read: `run_on_every_rank`).

Why its own: the waits are in Python (`_polled`), not in a blocking collective, so that a
waiting rank still takes Ctrl-C and SIGTERM, and a stop or failure on one rank is told to
the others rather than met as a lost rank; one idea, apart from joining the group.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from kiln.errors import KilnError, MainRankInterrupted, Terminated, alike_on_every_rank
from kiln.interrupts import what_stops_at_once
from kiln.parallel.distributed import (
    DistEnv,
    first_on_its_node,
    long_wait_cut,
    long_wait_group,
    lost_a_rank,
)


def run_on_main(env: DistEnv, work: Callable[[], None], told: Callable[[BaseException], str],
                error: type[Exception]) -> None:
    """Run `work` on rank 0 alone (data stages, a checkpoint write) while the other ranks
    wait, and end every rank alike: rank 0 raises what `work` raised; the others raise
    `error(told(it))` (met alike: `kiln` says it once per node, rank 0 on its own), or `MainRankInterrupted` if rank 0 was interrupted (a Ctrl-C or a
    SIGTERM's stop on rank 0 alone must not leave them waiting: torchrun stops them, but a
    hand launch hangs for a week, and either way they would die in a raw gloo error).

    The work can outlast the process group's timeout (NCCL 10 min, gloo 30 min), so the
    wait is on a gloo group of its own with a week's; and in Python (`_wait_for_main`), so
    that a waiting rank still takes Ctrl-C and SIGTERM, which a blocking collective holds
    back until it returns."""
    failure: BaseException | None = None
    if env.is_main:
        try:
            work()
        except BaseException as e:  # told to the other ranks first, then raised here
            failure = e
    if env.distributed and env.is_main:
        _tell_the_others(failure, told)
    elif env.distributed:
        said, stop = _wait_for_main()
        if said is not None:
            interrupted, message, exit_code = said
            if interrupted:
                raise MainRankInterrupted(message, exit_code)
            with alike_on_every_rank():  # rank 0's error, said by rank 0 (once per node)
                raise error(message)
        if stop is not None:  # asked to stop while rank 0 finished: this rank stops alone
            raise stop
    if failure is not None:
        raise failure


# how long a rank asked to stop while it waits for rank 0 still waits, for rank 0's word that
# it stopped too (a scheduler's SIGTERM, torchrun's forwarded Ctrl-C reach every rank): under
# the 30 s torchrun and SLURM (KillWait) give before SIGKILL
STOP_GRACE_S = 15.0
_POLL_S = 0.05
_SAY_AFTER_S = 1.0  # a rank stopped in its own work says it waits only when the others are late


def _tell_the_others(failure: BaseException | None, told: Callable[[BaseException], str]) -> None:
    """Rank 0's side of `run_on_main`: how the work went, as the length of what it says (0:
    it went well), then (if it failed) what it says. Ranks already gone (stopped on a signal
    of their own) cannot hear of a failure, which is then rank 0's to raise; a success they
    cannot hear of is a lost rank, raised."""
    group = long_wait_group()
    said = b"" if failure is None else pickle.dumps(
        (isinstance(failure, KeyboardInterrupt), told(failure), getattr(failure, "exit_code", 130)))
    try:
        _sent(dist.broadcast(torch.tensor([len(said)], dtype=torch.int64), src=0, group=group,
                             async_op=True), group)
        if said:
            _sent(dist.broadcast(torch.frombuffer(bytearray(said), dtype=torch.uint8), src=0,
                                 group=group, async_op=True), group)
    except RuntimeError as e:
        if failure is None or not lost_a_rank(e):
            raise


def _wait_for_main() -> tuple[tuple[bool, str, int] | None, KeyboardInterrupt | None]:
    """The other ranks' side of `run_on_main`: rank 0's word (None if its work went well),
    and the stop this rank was asked for meanwhile, if any (`_polled`)."""
    group = long_wait_group()
    length = torch.zeros(1, dtype=torch.int64)
    stop = _polled(dist.broadcast(length, src=0, group=group, async_op=True), group)
    if not length.item():
        return None, stop
    said = torch.empty(int(length.item()), dtype=torch.uint8)
    dist.broadcast(said, src=0, group=group)  # sent at once: rank 0 is there
    return pickle.loads(said.numpy().tobytes()), stop  # rank 0's, as broadcast_object_list's


def _sent(pending: dist.Work, group: dist.ProcessGroup) -> None:
    """Rank 0's wait for its word (`pending`, a broadcast on `group`) to be sent, in Python:
    gloo may never end a send whose connection closed as it was written (`group_sockets`),
    so a closed connection of the group ends it as a lost rank (`_cut_off`). A stop
    meanwhile ends it as it would have ended rank 0 once a blocking send returned."""
    cut_at, pause = None, 0.001
    try:
        while not pending.is_completed():
            cut_at = _cut_off(pending, group, cut_at)
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S)
    except KeyboardInterrupt:
        _never_freed(group, pending)
        raise
    pending.wait()  # raises a lost rank's error


# a closed connection's own error (gloo's words, the clue) is waited for this long
_TOLD_S = 1.0


def _cut_off(pending: dist.Work, group: dist.ProcessGroup, cut_at: float | None) -> float | None:
    """When a connection of the long-wait group closed (`cut_at`: when it was seen) and
    `pending` has not ended with gloo's error `_TOLD_S` since, the lost rank it was never
    told of, raised (`pending` never freed). Returns when the closed connection was seen."""
    if cut_at is None:
        return time.monotonic() if long_wait_cut() else None
    if time.monotonic() - cut_at <= _TOLD_S:
        return cut_at
    _never_freed(group, pending)
    raise dist.DistBackendError("a connection to another rank closed, and gloo never ended this "
                                "rank's wait on it")


def _polled(pending: dist.Work, group: dist.ProcessGroup, stop: KeyboardInterrupt | None = None,
            waiting_for: str = "rank 0") -> KeyboardInterrupt | None:
    """Wait for the collective `pending` (on `group`) in Python, so that a signal's handler
    runs, which a blocking collective holds back until the slowest rank comes; returns the
    stop this rank was asked for meanwhile (or was given: `stop`), if any. Asked to stop,
    the rank waits up to `STOP_GRACE_S` more for the others (`waiting_for`) to stop as well
    and tell it, and stops at once when asked again or when the grace runs out. A closed
    connection of the group whose wait gloo does not end is a lost rank (`_cut_off`)."""
    deadline = say_at = float("inf")
    if stop is not None:  # said if the others are not there at once (torchrun's stop: they are)
        deadline, say_at = time.monotonic() + STOP_GRACE_S, time.monotonic() + _SAY_AFTER_S
    pause, cut_at = 0.001, None  # a short wait (a checkpoint's) ends soon after
    while True:
        try:
            while not pending.is_completed():
                cut_at = _cut_off(pending, group, cut_at)
                if time.monotonic() > say_at:
                    _say_stopping(stop, waiting_for)  # type: ignore[arg-type]  # set with stop
                    say_at = float("inf")
                if time.monotonic() > deadline:
                    raise stop  # type: ignore[misc]  # deadline is set with stop
                time.sleep(pause)
                pause = min(2 * pause, _POLL_S)
            break
        except KeyboardInterrupt as e:
            if stop is not None:
                _never_freed(group, pending)
                raise
            stop, deadline = e, time.monotonic() + STOP_GRACE_S
            _say_stopping(e, waiting_for)
    pending.wait()  # raises a lost rank's error
    return stop


T = TypeVar("T")


def run_on_every_rank(env: DistEnv, work: Callable[[], T], told: Callable[[BaseException], str],
                      error: type[Exception]) -> T:
    """Run `work` on every rank where it may fail on some ranks alone (each reads its own
    copy of a checkpoint: one node's may be damaged), and end every rank alike. Failed on
    any rank, it raises on every rank the failure of the first rank it failed on, as
    "rank R " + `told(e)`, marked as met alike (`kiln` says it once per node, not each rank
    its own story: the failed rank its error, the others a lost rank, or their own file
    blamed for a collective the failed rank left). A Kiln error keeps its type (so every
    rank exits with its status); any other is `error` on the other ranks and is raised as
    it is on its own (its traceback is the clue). A rank interrupted in `work` stops as
    interrupted, and the others as `MainRankInterrupted`, as in `run_on_main`.

    The ranks agree in a Python wait (`_polled`), not a blocking collective: a rank that
    waits for a slower one (rank 0 reading a large checkpoint) still takes Ctrl-C and
    SIGTERM."""
    failure: BaseException | None = None
    try:
        result = work()
    except BaseException as e:  # agreed with the other ranks first
        failure = e
    if env.distributed:
        group = long_wait_group()
        failed = torch.tensor([failure is not None], dtype=torch.int64)
        pending = dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group, async_op=True)
        given = failure if isinstance(failure, KeyboardInterrupt) else None
        stop = _polled(pending, group, given, "the other ranks")
        if failed.item():
            _raise_the_first_failure(env, group, failure, told, error)
        if stop is not None:  # asked to stop while the others finished: this rank stops alone
            raise stop
    if failure is not None:
        raise failure
    return result


def _raise_the_first_failure(env: DistEnv, group: dist.ProcessGroup,
                             failure: BaseException | None,
                             told: Callable[[BaseException], str], error: type[Exception]) -> None:
    """`run_on_every_rank`'s end when `work` failed on some rank: every rank's failure
    gathered, the first rank interrupted (else the first failed) raised on every rank."""
    mine = None if failure is None else (
        isinstance(failure, KeyboardInterrupt), told(failure), getattr(failure, "exit_code", 130),
        type(failure) if isinstance(failure, KilnError) else None)
    said: list[Any] = [None] * env.world_size
    dist.all_gather_object(said, mine, group=group)
    failed = [r for r, s in enumerate(said) if s is not None]
    rank = next((r for r in failed if said[r][0]), failed[0])
    interrupted, message, exit_code, kind = said[rank]
    if rank == env.rank and (interrupted or kind is None):
        raise failure  # type: ignore[misc]  # its own stop, or a bug's traceback
    if interrupted:
        raise MainRankInterrupted(f"rank {rank} {message}", exit_code)
    try:
        agreed = (kind or error)(f"rank {rank} {message}")
    except TypeError:  # a Kiln error made otherwise than from its message
        agreed = error(f"rank {rank} {message}")
    with alike_on_every_rank():
        raise agreed from (failure if rank == env.rank else None)


def _never_freed(*objects: object) -> None:
    """A wait given up leaves gloo's thread in the broadcast's receive (for the group's week:
    gloo's abort does not end it), and the group's destructor joins that thread: freed (by
    `shutdown`, or at exit), it would hang the rank's exit. The process is stopping: the
    group is kept to the end, when the thread ends with it."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _say_stopping(e: KeyboardInterrupt, waiting_for: str = "rank 0") -> None:
    """A hand launch's rank, in a terminal of its own, answers Ctrl-C at once; under
    torchrun rank 0 speaks for the ranks (one line, said when it stops)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and first_on_its_node():
        signame = e.signal_name if isinstance(e, Terminated) else "Ctrl-C"
        sig = signal.Signals[e.signal_name] if isinstance(e, Terminated) else signal.SIGINT
        print(f"\nkiln: {signame}: waiting up to {STOP_GRACE_S:.0f} s for {waiting_for} to stop "
              f"as well ({what_stops_at_once(sig)})", file=sys.stderr, flush=True)
