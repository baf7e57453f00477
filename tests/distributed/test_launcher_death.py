"""A torchrun killed outright takes its workers with it (they are not left as orphans)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from launch import free_port

WORKER = """
import os, sys, time, torch
from kiln.parallel.distributed import init_distributed
init_distributed(torch.device("cpu"))
with open(os.path.join(sys.argv[1], f"pid{os.environ['RANK']}"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_end_when_torchrun_is_killed(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    launcher = subprocess.Popen(
        [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", str(script), str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    pids = []
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            pids = [int(p.read_text()) for p in tmp_path.glob("pid*") if p.read_text()]
        assert len(pids) == 2, "the workers did not start"
        time.sleep(2)
        assert all(_alive(p) for p in pids), "a worker ended while its torchrun ran"
        launcher.send_signal(signal.SIGKILL)  # no chance to stop its workers itself
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "workers outlived their torchrun"
    finally:
        launcher.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
