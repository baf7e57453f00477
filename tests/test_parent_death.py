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


LAUNCHER = """
import ctypes, os, subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
print(child.stdout.readline().decode(), end="", flush=True)  # its first look, while it runs
threading.Thread(target=lambda: (print(child.stdout.read().decode(), end="", flush=True),
                                 os._exit(child.wait()))).start()  # its other thread
ctypes.CDLL(None).pthread_exit(None)  # its main thread ends first, as when killed
"""

RANK = """
import os, time
from kiln.parallel import rank_stops
rank_stops._launcher = os.getppid()
print(rank_stops._launcher_gone(), flush=True)
def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
deadline = time.monotonic() + 60
while state(rank_stops._launcher) != "Z" and time.monotonic() < deadline:
    time.sleep(0.01)  # its main thread ended, its other threads not
print(os.getppid() == rank_stops._launcher, rank_stops._launcher_gone(), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_a_rank_sees_its_launcher_gone_while_the_launchers_threads_still_end():
    """A SIGKILLed torchrun's main thread ends before its other threads: the kernel hands
    its ranks to one of those (sending the death signal), so getppid() still names torchrun,
    whose store no longer answers. A rank on its way out asked it, and printed C++ frames."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, RANK], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr
