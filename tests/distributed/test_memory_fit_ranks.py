"""A model that does not fit one rank's device (or host) memory: every rank refuses with its
reason, not the short rank alone (the others met a lost rank in the model's first
collective, saying only that another rank failed or was killed)."""

from __future__ import annotations

from conftest import tiny_config
from mp_helpers import run_function_on_ranks


def _start_short_on(rank: int, world_size: int, tiny_run, short: int) -> str:
    import kiln.train.memory_fit as memory_fit
    from kiln.config import ConfigError
    from kiln.train.trainer import Trainer

    if rank == short:  # this rank's device has 1 kB free: a GPU another process holds
        memory_fit.device_memory_available = lambda device: 1000
    try:
        Trainer(tiny_config(tiny_run, "train.parallel=ddp"))
    except ConfigError as e:
        return str(e)
    except RuntimeError as e:  # the lost rank, met in DDP's first broadcast
        return f"RuntimeError: {e}"
    return "started"


def test_memory_short_on_one_rank_is_said_by_every_rank(tiny_run):
    said = run_function_on_ranks(_start_short_on, 2, args=(tiny_run, 1), timeout=120)
    for msg in said:
        assert msg.startswith("rank 1 cannot train here: the model has "), msg
        assert "more than this machine's free memory (0.0 GiB)" in msg
