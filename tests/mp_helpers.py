"""Run a picklable function on N gloo ranks in spawned processes, with a hang timeout.

`tests/launch.py` runs the `kiln` CLI as ranks; this runs a Python function instead, for
tests that check a collective inside one component (e.g. counts all-reduced across ranks).
"""

from __future__ import annotations

import io
import os
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from launch import free_port


def _rank_main(fn: Callable, rank: int, world_size: int, port: int, out, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            # send bytes, not tensors: a tensor in a queue travels as shared memory that
            # vanishes if this process exits before the parent has read it
            buf = io.BytesIO()
            torch.save(fn(rank, world_size, *args), buf)
            out.put((rank, True, buf.getvalue()))
        finally:
            if dist.is_initialized():  # `kiln run` ends its group itself when it fails
                dist.destroy_process_group()
    except BaseException:  # report everything: the parent otherwise only sees a timeout
        out.put((rank, False, traceback.format_exc()))


def run_function_on_ranks(
    fn: Callable[..., Any], world_size: int, args: tuple = (), timeout: float = 120
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank; returns the results ordered by rank.

    Raises with the failing rank's traceback, or after `timeout` seconds (all ranks are
    killed either way, so a hung collective fails the test instead of hanging CI)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, out, args))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = out.get(timeout=timeout)
            except queue.Empty as e:
                raise RuntimeError(f"ranks hung for more than {timeout}s") from e
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)
        for p in procs:
            p.join(timeout=timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]
