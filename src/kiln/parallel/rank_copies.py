"""Which ranks hold which copy of a run's file: ranks reading their own copies of the run (a
node's own disk) may hold other checkpoints or token shards under the same names, each valid,
and would mix two models or two datasets silently. Shared by the trainer's resume and
`kiln eval`."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from kiln.parallel.distributed import DistEnv

ONE_COPY = ("every rank must read the same run directory (one shared filesystem across nodes), "
            "or the same copy of it")


def ranks_text(ranks: list[int], shown: int = 8) -> str:
    """"rank 1", "ranks 0, 2", or the first `shown` and how many more."""
    listed = ", ".join(map(str, ranks[:shown]))
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}{more}"


def copies_held(env: DistEnv, copy: str | None) -> str | None:
    """Which ranks hold which copy of a file (`copy`: this rank's digest of it), as
    "rank 0 holds one, rank 1 another"; None where every rank holds the same. A collective:
    every rank calls it."""
    if not env.distributed:
        return None
    copies: list[Any] = [None] * env.world_size
    dist.all_gather_object(copies, copy)
    if len(set(copies)) == 1:
        return None
    groups: dict[str | None, list[int]] = {}
    for rank, digest in enumerate(copies):
        groups.setdefault(digest, []).append(rank)
    first, *others = (ranks_text(ranks) for ranks in groups.values())
    return f"{first} {'holds' if first.startswith('rank ') else 'hold'} one, " + \
        ", ".join(f"{ranks} another" for ranks in others)
