"""`kiln prepare` with `prepare.workers` > 1 stopped by a signal to its whole process group
(Ctrl-C, a terminal's hang-up, a scheduler's `kill -TERM -PGID`), which reaches datatrove's
pool workers, its manager, multiprocess's fork server and resource tracker too: the parent
says its one line and exits with the signal's status, and no helper is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# every task of the pool marks that it runs, then takes long: the stop lands mid-stage. The
# fork server imports this script (its `__main__`) before it forks the workers: they run it.
SLOW_TASKS = """
import os, signal, sys, time
from pathlib import Path
from kiln.data.quiet_executor import KilnLocalExecutor

def slow_task(self, rank, *args, **kwargs):
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    deaf = [s.name for s in (signal.SIGINT, signal.SIGHUP)
            if s in blocked or signal.getsignal(s) is signal.SIG_IGN]
    mark = Path(os.environ["KILN_TEST_MARKS"], f"{os.getpid()}-{rank}")
    mark.write_text(" ".join(["deaf:", *deaf]))
    time.sleep(30)

KilnLocalExecutor._run_for_rank = slow_task
if __name__ == "__main__":
    import signal
    from kiln import cli
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal's, whoever runs the tests:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores both
    sys.exit(cli.main(sys.argv[1:]))
"""


def _alive_in_session(sid: int) -> list[str]:
    """The processes of session `sid` still running (zombies are done: an init that does not
    reap orphans keeps them)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(f"{entry.name}: {stat[:stat.rindex(')') + 1]}")
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize(("sig", "to_group", "workers", "said"), [
    ("SIGINT", True, 2, "kiln: prepare interrupted; "),
    ("SIGTERM", True, 2, "kiln: prepare stopped on SIGTERM; "),
    ("SIGHUP", True, 2, "kiln: prepare stopped on SIGHUP; "),
    ("SIGHUP", False, 2, "kiln: prepare stopped on SIGHUP; ")])
def test_a_stop_to_the_process_group_stops_prepare_and_its_workers(tmp_path, sig, to_group,
                                                                   workers, said):
    """Before: SIGINT printed each worker's KeyboardInterrupt traceback; SIGTERM ended the
    manager (a fork holding Kiln's handler; one there with a single worker too), and the
    parent exited 1 with a ConnectionResetError or BrokenPipeError traceback; SIGHUP ended
    the fork server and the resource tracker (exit 1, "[Errno 2]", the tracker's "died
    unexpectedly" and KeyErrors), and the pool, taking its workers for exited, left them
    running."""
    corpus, marks = tmp_path / "corpus", tmp_path / "marks"
    corpus.mkdir()
    marks.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(f"Document {i} says a few plain words.\n" * 20)
    script = tmp_path / "slow_tasks.py"
    script.write_text(SLOW_TASKS)
    run = tmp_path / "run"
    cmd = [sys.executable, str(script), "prepare", "--set", f'run.dir="{run}"', "--set",
           f'data.sources=["{corpus}"]', "--set", "prepare.tasks=4", "--set",
           f"prepare.workers={workers}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1",
                                 "KILN_TEST_MARKS": str(marks)})
    try:
        deadline = time.monotonic() + 120
        while sum(m.stat().st_size > 0 for m in marks.iterdir()) < workers:  # each in a task
            assert proc.poll() is None and time.monotonic() < deadline, "never reached the pool"
            time.sleep(0.02)
        (os.killpg if to_group else os.kill)(proc.pid, getattr(signal, sig))
        err = proc.communicate(timeout=60)[1]
        deadline = time.monotonic() + 10
        while (left := _alive_in_session(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if _alive_in_session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, sig), err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()
             and not line.startswith("prepare: read -> ")]
    assert len(lines) == 1 and lines[0].startswith(said), err[-3000:]
    assert not left, left
    assert not (run / "documents").exists()
    # the workers leave a Ctrl-C and a hang-up to the parent (which ends them with SIGTERM)
    if workers > 1:
        assert all(m.read_text() == "deaf: SIGINT SIGHUP" for m in marks.iterdir())
