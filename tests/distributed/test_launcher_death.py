"""A torchrun killed outright takes its workers with it (they are not left as orphans), and
they end with Kiln's one line, not C++ frames of the store that died with it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun's ranks)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_ranks_of_a_killed_torchrun_end_with_kilns_line_alone(tiny_run, tmp_path):
    """A torchrun killed outright in training: its ranks stop on the SIGTERM the kernel
    sends them and save a checkpoint, and rank 0 says so in one line. Each rank printed ~25
    lines of C++ frames first (`TCPStore recvValue failed`): on its way out it asked the
    store, gone with torchrun, which ranks had stopped on a signal of their own."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    log = tmp_path / "torchrun.log"
    with open(log, "wb") as out:  # the ranks write here themselves: torchrun's --tee dies with it
        launcher = subprocess.Popen(
            [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "kiln", "train",
             str(tiny_run), "--set", "train.steps=100000", "--set", "train.checkpoint_every=50"],
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not list((tiny_run / "checkpoints").glob("step_*")):  # training is under way
            assert launcher.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        ranks = _children(launcher.pid)
        assert len(ranks) == 2, ranks
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in ranks), "the ranks outlived their torchrun"
    finally:
        launcher.kill()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    said = log.read_text(errors="replace")
    for noise in ("TCPStore", "frame #", "Traceback", "[c10d]"):
        assert noise not in said, said
    lines = [line for line in said.splitlines() if line.startswith("kiln:")]
    assert len(lines) == 1, said
    step = re.fullmatch(r"kiln: train: training stopped on SIGTERM after step (\d+); a checkpoint "
                        r"of that step is in .*; `kiln train .*` goes on from there", lines[0])
    assert step, lines
    latest = (tiny_run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{int(step[1]):08d}", (latest, lines)
