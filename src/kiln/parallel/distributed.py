"""Everything that knows about ranks: process group setup, reductions, work on rank 0 alone.

Launch with `torchrun`; without it Kiln runs as a single process and none of this
changes the model. gloo on CPU, NCCL on GPU. The model is wrapped for the ranks (DDP /
FSDP2) in `model_wrapping`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

from kiln.config import ConfigError
from kiln.errors import KilnError, MainRankInterrupted, Terminated, alike_on_every_rank
from kiln.interrupts import what_stops_at_once
from kiln.parallel.rank_stops import keep_store, on_the_way_out


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False  # by torchrun: one process still joins a group and is wrapped

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.launched


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or a plain process: the one that writes shared files.
    Readable before the process group exists (from torchrun's RANK)."""
    return os.environ.get("RANK", "0") == "0"


def first_on_its_node() -> bool:
    """Local rank 0 of a torchrun launch, or a plain process: one per machine, to say what
    every rank of a machine hits alike (a recipe that may differ from one node's disk to
    the next)."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def launched_ranks() -> int:
    """How many processes this launch has (torchrun's WORLD_SIZE), before any group exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def lost_a_rank(e: RuntimeError) -> bool:
    """A collective that failed because a peer process went away (gloo: the connection
    reset; NCCL: the communicator aborted), as opposed to a bug in this rank or a failure
    to join the group here (a port in use, no rendezvous). The rendezvous store's own
    connection dropping once made is a lost rank too: without torchrun, rank 0 holds the
    store, and ranks waiting on it (for a new group) learn of its death so."""
    if launched_ranks() <= 1 or isinstance(e, dist.DistStoreError):
        return False
    if isinstance(e, dist.DistNetworkError):
        return any(s in str(e) for s in _STORE_LOST)
    lost = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
            "NCCL communicator was aborted", "ProcessGroupNCCL")
    return isinstance(e, dist.DistBackendError) or any(s in str(e) for s in lost)


# a store connection that existed and dropped (not one that could not be made)
_STORE_LOST = ("Connection reset by peer", "Connection was likely closed", "Broken pipe")


def init_distributed(device: torch.device, settings: dict[str, Any] | None = None) -> DistEnv:
    """Join the process group that torchrun describes in the environment, if any, and check
    that every rank has the same `settings` (the flattened config).

    Under torchrun even one process joins (and is wrapped in DDP / FSDP2), so that
    `torchrun --nproc_per_node=1` exercises the same path as a bigger launch."""
    world = launched_ranks()
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # torchrun sets it
    if world <= 1 and not launched:
        return DistEnv()
    if "RANK" not in os.environ:
        raise ConfigError(f"WORLD_SIZE={world} is set but RANK is not: start several processes "
                          "with torchrun, or unset WORLD_SIZE for one")
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        on_gpu: dict[str, Any] = {}
        if device.type == "cuda":
            index = gpu_index(local, launched)
            torch.cuda.set_device(index)
            # NCCL told its device up front, rather than guessing it at the first collective
            on_gpu["device_id"] = torch.device("cuda", index)
        store = _rendezvous(backend)
        dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store),
                                rank=rank, world_size=world, **on_gpu)
        keep_store(dist.PrefixStore("kiln", store), os.getppid() if launched else None)
    if launched:
        die_with_launcher()
    env = DistEnv(rank=rank, world_size=world, local_rank=local, launched=launched)
    if settings is not None and world > 1:
        _check_same_settings(settings, env)
    _long_wait_group()  # now, while every rank is here: see `run_on_main`
    return env


def _rendezvous(backend: str) -> dist.Store:
    """The store `init_process_group` would meet the other ranks in (torchrun's agent's, or
    rank 0's in a hand launch: env://), made here by torch's public `rendezvous`, so that
    Kiln keeps it (`rank_stops`): torch hands the default group's store out only by a
    private function. The timeout is init_process_group's own default for the backend."""
    timeout = (default_pg_nccl_timeout if backend == "nccl" else None) or default_pg_timeout
    store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return store


def die_with_launcher() -> None:
    """torchrun starts its workers in sessions of their own: a torchrun killed outright
    (SIGKILL, the OOM killer) would leave them training on as orphans that write checkpoints
    nobody waits for, then fail in a collective whose store died with it, in pages of C++
    frames. On Linux the kernel ends them with it instead (SIGTERM; checkpoints are atomic).
    Only under torchrun: a hand launch's shell may leave its ranks running on purpose."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl (another libc): keep the old behaviour
        return
    if os.getppid() != parent:  # it died before the request took: nothing would send it
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _check_same_settings(settings: dict[str, Any], env: DistEnv) -> None:
    """Ranks started with other settings (per-node recipes, a hand launch) would train
    replicas that drift apart, read other data, or hang in a collective one rank never
    reaches; every rank sees every rank's settings, so all of them refuse alike. `run.dir`
    may be spelled differently on each node (one shared folder mounted at other paths):
    that the ranks share it is checked by the checkpoint they find."""
    settings = {k: v for k, v in settings.items() if k != "run.dir"}
    slots: list[Any] = [None] * env.world_size
    dist.all_gather_object(slots, settings)
    gathered: list[dict[str, Any]] = slots
    keys = sorted({k for g in gathered for k in g})
    differ = [k for k in keys if any(g.get(k) != gathered[0].get(k) for g in gathered)]
    if differ:
        shown = "; ".join(
            f"{k}: " + ", ".join(f"rank {r} {g.get(k)!r}" for r, g in enumerate(gathered))
            for k in differ[:3])
        raise ConfigError(f"the ranks were started with different settings ({shown}"
                          f"{'; ...' if len(differ) > 3 else ''}): every rank must load the same "
                          "recipe with the same --set overrides")


def gpu_index(local_rank: int, launched: bool) -> int:
    """The GPU a rank trains on: its local rank's, among the GPUs it sees. A launcher that
    gives each task a GPU of its own (srun --gpus-per-task: CUDA_VISIBLE_DEVICES set per
    task, to one GPU) leaves one visible, numbered 0 whatever the local rank: that one is
    the rank's. Without such a choice (no CUDA_VISIBLE_DEVICES, or under torchrun, which
    shows each worker every GPU of the node) a local rank past the GPUs is one process too
    many: a lone GPU would be shared, which NCCL refuses."""
    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if count == 1 and len(given) == 1 and not launched:
        return 0
    raise ConfigError(f"local rank {local_rank} has no GPU of its own: {count} are visible; "
                      "start at most that many processes per node (torchrun --nproc_per_node), "
                      "or give each its own GPU (CUDA_VISIBLE_DEVICES set per process)")


def local_device(device: torch.device, env: DistEnv) -> torch.device:
    if device.type != "cuda":
        return device
    return torch.device("cuda", gpu_index(env.local_rank, env.launched))


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return value


def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def all_reduce_max(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


_LONG_WAIT: dist.ProcessGroup | None = None


def _long_wait_group() -> dist.ProcessGroup:
    """The gloo group `run_on_main` waits on, made when the ranks join: made at the first
    wait instead, a rank that had died before it (a failure on rank 1 alone while rank 0
    wrote the first checkpoint) would leave rank 0 waiting for it in the store for the
    group's week, where a made group's closed connection fails at once."""
    global _LONG_WAIT
    if _LONG_WAIT is None:
        _LONG_WAIT = dist.new_group(backend="gloo", timeout=timedelta(days=7))
    return _LONG_WAIT


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
    """Rank 0's side of `run_on_main`: whether the work failed, then (if it did) how. Ranks
    already gone (stopped on a signal of their own) cannot hear of a failure, which is then
    rank 0's to raise; a success they cannot hear of is a lost rank, raised."""
    group = _long_wait_group()
    try:
        dist.broadcast(torch.tensor([failure is not None], dtype=torch.int64), src=0,
                       group=group)
        if failure is not None:
            said: list[Any] = [(isinstance(failure, KeyboardInterrupt), told(failure),
                                getattr(failure, "exit_code", 130))]
            dist.broadcast_object_list(said, src=0, group=group, device=torch.device("cpu"))
    except RuntimeError as e:
        if failure is None or not lost_a_rank(e):
            raise


def _wait_for_main() -> tuple[tuple[bool, str, int] | None, KeyboardInterrupt | None]:
    """The other ranks' side of `run_on_main`: rank 0's word (None if its work went well),
    and the stop this rank was asked for meanwhile, if any (`_polled`)."""
    group = _long_wait_group()
    failed = torch.zeros(1, dtype=torch.int64)
    stop = _polled(dist.broadcast(failed, src=0, group=group, async_op=True), group)
    if not failed.item():
        return None, stop
    said: list[Any] = [None]
    dist.broadcast_object_list(said, src=0, group=group, device=torch.device("cpu"))
    return said[0], stop


def _polled(pending: dist.Work, group: dist.ProcessGroup, stop: KeyboardInterrupt | None = None,
            waiting_for: str = "rank 0") -> KeyboardInterrupt | None:
    """Wait for the collective `pending` (on `group`) in Python, so that a signal's handler
    runs, which a blocking collective holds back until the slowest rank comes; returns the
    stop this rank was asked for meanwhile (or was given: `stop`), if any. Asked to stop,
    the rank waits up to `STOP_GRACE_S` more for the others (`waiting_for`) to stop as well
    and tell it, and stops at once when asked again or when the grace runs out."""
    deadline = say_at = float("inf")
    if stop is not None:  # said if the others are not there at once (torchrun's stop: they are)
        deadline, say_at = time.monotonic() + STOP_GRACE_S, time.monotonic() + _SAY_AFTER_S
    pause = 0.001  # a short wait (a checkpoint's) ends soon after
    while True:
        try:
            while not pending.is_completed():
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
        group = _long_wait_group()
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


def shutdown(env: DistEnv | None) -> None:
    """Leave the process group: `env`'s, or (None) the one this process joined, if any (a
    failure before the caller had its env: the trainer's setup). Groups left standing at
    exit, the peers gone, gloo's threads abort the process (SIGABRT: "terminate called
    without an active exception") instead of its exit with its status."""
    global _LONG_WAIT
    if (env is None or env.distributed) and dist.is_initialized():
        ending = sys.exc_info()[1]  # shut down on the way out of an exception
        if ending is not None:
            on_the_way_out(ending)  # while the store is there
        dist.destroy_process_group()
        _LONG_WAIT = None
    keep_store(None)  # rank 0 of a hand launch holds it: it goes with the group
