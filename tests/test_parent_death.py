"""A `kiln prepare` SIGKILLed while its pool works leaves no process behind: its manager
hung on a futex for good (and with it the fork server), and the workers ran their tasks to
the end. Linux only (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(root: int) -> set[int]:
    parents = _children()
    found, grew = set(), True
    while grew:
        new = {p for p, pp in parents.items() if (pp == root or pp in found) and p not in found}
        found |= new
        grew = bool(new)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_prepare_leaves_no_manager_fork_server_or_worker(tmp_path):
    cmd = [sys.executable, "-m", "kiln", "prepare", "--set", f'run.dir="{tmp_path / "run"}"',
           "--set", "data.max_bytes=8000000", "--set", "prepare.tasks=2",
           "--set", "prepare.workers=2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline, started = time.time() + 120, set()
        while time.time() < deadline:  # the manager, fork server, tracker and 2 workers
            started = _descendants(proc.pid)
            if len(started) >= 5 or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None and len(started) >= 5, "the pool never started"
        time.sleep(1)
        started = _descendants(proc.pid)
        proc.kill()
        proc.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(p) for p in started):
            time.sleep(0.2)
        left = sorted(p for p in started if _alive(p))
        assert not left, [Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:90]
                          for p in left]
    finally:  # whatever is left of its process group (the old code's orphans)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
