"""Spawn N ranks of a command on CPU (gloo) with a free port and a hang timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(args: list[str], world_size: int, timeout: float = 300, cwd: Path | None = None):
    """Run `python -m kiln.cli ARGS` as `world_size` ranks; returns rank 0's output."""
    return run_python(["-m", "kiln.cli", *args], world_size, timeout, cwd)


def run_python(args: list[str], world_size: int, timeout: float = 300, cwd: Path | None = None):
    """Run `python ARGS` (a script path or `-m module`, then its arguments) as `world_size`
    gloo ranks with torchrun's environment variables; returns rank 0's output.

    Every rank is killed if any fails or the timeout passes, so a hung collective fails the
    test instead of hanging CI."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
               "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, *args], env=env, cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    deadline = time.monotonic() + timeout
    outputs = [""] * world_size
    try:
        for i, p in enumerate(procs):
            outputs[i] = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            if p.returncode != 0:
                raise RuntimeError(f"rank {i} exited {p.returncode}:\n{outputs[i][-4000:]}")
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"ranks hung for more than {timeout}s") from e
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs[0]
