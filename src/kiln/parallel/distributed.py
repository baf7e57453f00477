"""Everything that knows about ranks: process group setup, reductions, leaving the group.

Launch with `torchrun`; without it Kiln runs as a single process and none of this
changes the model. gloo on CPU, NCCL on GPU. The model is wrapped for the ranks (DDP /
FSDP2) in `model_wrapping`; work on rank 0 alone, or on every rank where it may fail on
some, is waited for in `rank_waits`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

from kiln.config import ConfigError
from kiln.parallel.connect_log import native_log_held
from kiln.parallel.group_sockets import Connections, made
from kiln.parallel.rank_meeting import launch_attempt, meet
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
        with native_log_held(lost_a_rank):  # a rank lost meanwhile: its C++ frames unsaid
            dist.init_process_group(backend=backend,
                                    store=dist.PrefixStore("default_pg", store),
                                    rank=rank, world_size=world, **on_gpu)
        joined_here(True)
        # this attempt's: an earlier one's word (rank 1 ran out of memory) would be read as
        # this one's, a lost rank then said by nobody
        keep_store(dist.PrefixStore(f"kiln/words/{launch_attempt()}", store),
                   os.getppid() if launched else None)
    if launched:
        die_with_launcher()
    env = DistEnv(rank=rank, world_size=world, local_rank=local, launched=launched)
    with native_log_held(lost_a_rank):
        if settings is not None and world > 1:
            _check_same_settings(settings, env)
        long_wait_group()  # now, while every rank is here: see `rank_waits.run_on_main`
    return env


_joined = False  # this command made the process group (`leave_the_process`)


def joined_here(joined: bool) -> None:
    """Set by `init_distributed` when it made the group; cleared as a `kiln` command starts."""
    global _joined
    _joined = joined


def leave_the_process(code: int) -> None:
    """End a process that joined a process group with `code`, at once, once `kiln` has said
    its last line: not through the interpreter's teardown. gloo's work threads outlive
    `destroy_process_group`, and one lets go of a finished collective late (seen in a core:
    ~AsyncAllgatherWork, after `all_gather_object` returned); the last reference to its
    tensors' Python objects needs the GIL. Taken back while the interpreter tears down, the
    thread is ended (pthread_exit) inside that C++ destructor, which is std::terminate: the
    rank, its line said, aborted ("terminate called without an active exception", SIGABRT,
    its status lost: torchrun reports a crash), about 1 run in 30 on a loaded machine.
    What `kiln` writes is atomic and closed by then; its output is flushed here. A process
    that joined no group returns."""
    if not _joined:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # its reader gone, or closed: nothing more can be said
            pass
    os._exit(code)


def _rendezvous(backend: str) -> dist.Store:
    """The store `init_process_group` would meet the other ranks in (torchrun's agent's, or
    rank 0's in a hand launch: env://), made here once every rank has reached it, in a wait
    that takes Ctrl-C and SIGTERM (`rank_meeting`), and kept (`rank_stops`): torch hands
    the default group's store out only by a private function. The timeout is
    init_process_group's own default for the backend."""
    timeout = (default_pg_nccl_timeout if backend == "nccl" else None) or default_pg_timeout
    store = meet(timeout)
    store.set_timeout(timeout)
    return store


def die_with_launcher() -> None:
    """torchrun starts its workers in sessions of their own: a torchrun killed outright
    (SIGKILL, the OOM killer) would leave them training on as orphans that write checkpoints
    nobody waits for, then fail in a collective whose store died with it, in pages of C++
    frames. On Linux the kernel ends them with it instead (SIGTERM; checkpoints are atomic),
    once for each of torchrun's threads that ends holding them (each hands them to the next):
    the later ones are the same stop (`stop_signals`), and the store is gone from the first
    (`rank_stops._launcher_gone`).
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


def gather_on_main(value: torch.Tensor, env: DistEnv) -> torch.Tensor | None:
    """Every rank's `value` (the same shape on each) stacked on rank 0 as (world, *shape);
    None on the other ranks. A gather, not an all-gather: only rank 0 holds them all."""
    if not env.distributed:
        return value[None]
    value = value.contiguous()
    out = ([torch.empty_like(value) for _ in range(env.world_size)] if env.is_main
           else None)
    dist.gather(value, out, dst=0)
    return torch.stack(out) if out is not None else None


_LONG_WAIT: dist.ProcessGroup | None = None
_LONG_WAIT_LINKS: Connections | None = None  # its connections' sockets (`long_wait_cut`)


def long_wait_group() -> dist.ProcessGroup:
    """The gloo group `rank_waits` waits on, made when the ranks join: made at the first
    wait instead, a rank that had died before it (a failure on rank 1 alone while rank 0
    wrote the first checkpoint) would leave rank 0 waiting for it in the store for the
    group's week, where a made group's closed connection fails at once."""
    global _LONG_WAIT, _LONG_WAIT_LINKS
    if _LONG_WAIT is None:
        store_port = int(os.environ.get("MASTER_PORT", "0") or 0) or None
        _LONG_WAIT, _LONG_WAIT_LINKS = made(
            lambda: dist.new_group(backend="gloo", timeout=timedelta(days=7)), store_port)
    return _LONG_WAIT


def long_wait_cut() -> bool:
    """Whether a connection of the long-wait group has closed: a rank is gone, though a
    send of this rank's on the group may never be told (`group_sockets`)."""
    return _LONG_WAIT_LINKS is not None and _LONG_WAIT_LINKS.closed()


def shutdown(env: DistEnv | None) -> None:
    """Leave the process group: `env`'s, or (None) the one this process joined, if any (a
    failure before the caller had its env: the trainer's setup). Groups left standing at
    exit, the peers gone, gloo's threads abort the process (SIGABRT: "terminate called
    without an active exception") instead of its exit with its status."""
    global _LONG_WAIT, _LONG_WAIT_LINKS
    if (env is None or env.distributed) and dist.is_initialized():
        ending = sys.exc_info()[1]  # shut down on the way out of an exception
        if ending is not None:
            on_the_way_out(ending)  # while the store is there
        dist.destroy_process_group()
        _LONG_WAIT = _LONG_WAIT_LINKS = None
    keep_store(None)  # rank 0 of a hand launch holds it: it goes with the group
