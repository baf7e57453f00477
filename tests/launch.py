"""Spawn N ranks of a command on CPU (gloo) with a free port and a hang timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(args: list[str], world_size: int, timeout: float = 300, cwd: Path | None = None,
              every_rank: bool = False):
    """Run `python -m kiln.cli ARGS` as `world_size` ranks; returns rank 0's output (every
    rank's, in a list, with `every_rank`)."""
    return run_python(["-m", "kiln.cli", *args], world_size, timeout, cwd, every_rank)


def start_python(args: list[str], world_size: int, cwd: Path | None = None,
                 ranks: list[int] | None = None) -> tuple[list[subprocess.Popen], list]:
    """Start `python ARGS` as `world_size` gloo ranks with torchrun's environment variables
    (only `ranks` of them, if given: a launch some ranks of which never came); each rank's
    output (stdout and stderr) goes to a temporary file of its own, returned."""
    port = free_port()
    procs, logs = [], []
    for rank in range(world_size) if ranks is None else ranks:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
               "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
        logs.append(tempfile.TemporaryFile())  # a file, not a pipe: a chatty rank never blocks
        procs.append(subprocess.Popen([sys.executable, *args], env=env, cwd=cwd,
                                      stdout=logs[-1], stderr=subprocess.STDOUT))
    return procs, logs


def run_python(args: list[str], world_size: int, timeout: float = 300, cwd: Path | None = None,
               every_rank: bool = False):
    """Run `python ARGS` (a script path or `-m module`, then its arguments) as `world_size`
    gloo ranks with torchrun's environment variables; returns rank 0's output (or all).

    Every rank is killed if any fails or the timeout passes, so a hung collective fails the
    test instead of hanging CI."""
    procs, logs = start_python(args, world_size, cwd)
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                time.sleep(5)  # the others see the closed connection and exit, or are killed
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks hung for more than {timeout}s")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read().decode(errors="replace"))
            log.close()
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:  # every failed rank's tail: the first to fail holds the cause
        raise RuntimeError("\n".join(f"rank {i} exited {procs[i].returncode}:\n"
                                      f"{outputs[i][-3000:]}" for i in failed))
    return outputs if every_rank else outputs[0]
