"""Rank 1 killed as rank 0 tells it that a checkpoint is written: rank 0 still exits with its
one line. gloo queues a send whose write met the connection already ended by its peer, and
never fails it when it then reads the end; rank 0 waited in that send for the long-wait
group's week (test_ranks' killed-rank test: 1 run in ~9 of the suite). The race is made
certain here: rank 1 stopped (SIGSTOP), rank 0's end of their long-wait connection shut for
writing, so that its send's write fails as one to an ended connection does; rank 1 then
killed (its end of the connection closes as it would have a moment before)."""

from __future__ import annotations

import contextlib
import signal
import subprocess

from launch import start_python

HANG_S = 60  # rank 0 still running this long after rank 1's kill is taken for hung

KILLED_WHILE_TOLD = """
import contextlib, os, signal, socket, sys, threading
import torch.distributed as dist
from kiln import cli
from kiln.parallel import rank_waits

pids, rank = sys.argv[1], os.environ["RANK"]
with open(os.path.join(pids, f"rank{rank}"), "w") as f:
    f.write(str(os.getpid()))

def sockets():
    return {fd for fd in map(int, os.listdir("/proc/self/fd"))
            if os.path.exists(f"/proc/self/fd/{fd}")
            and os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")}

long_wait = []  # rank 0's connections of the long-wait group (made with a week's timeout)
new_group = dist.new_group
def watched(*args, **kwargs):
    before = sockets()
    group = new_group(*args, **kwargs)
    if kwargs.get("timeout") is not None and kwargs["timeout"].days >= 1:
        long_wait.extend(sockets() - before)
    return group
dist.new_group = watched

if rank == "0":
    told, calls = rank_waits._tell_the_others, [0]
    def tell(failure, said):
        calls[0] += 1
        if calls[0] == 3:  # the first checkpoint's word (after the two of the start)
            with open(os.path.join(pids, "rank1")) as f:
                other = int(f.read())
            os.kill(other, signal.SIGSTOP)  # it reads nothing more: its end stays open
            for fd in long_wait:
                with socket.socket(fileno=os.dup(fd)) as s, contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_WR)  # the send's write fails, as after its end
            threading.Timer(1.0, os.kill, (other, signal.SIGKILL)).start()
        return told(failure, said)
    rank_waits._tell_the_others = tell
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_rank_killed_as_rank_zero_tells_it_stops_rank_zero_with_one_line(tiny_run, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # a SIGABRT below prints where rank 0 waits
    script = tmp_path / "killed_while_told.py"
    script.write_text(KILLED_WHILE_TOLD)
    procs, logs = start_python(
        [str(script), str(tmp_path), "train", str(tiny_run), "--set", "train.steps=2000",
         "--set", "train.checkpoint_every=2", "--set", "train.parallel=ddp"], world_size=2)
    try:
        procs[1].wait(timeout=240)  # killed by rank 0's script at the first checkpoint
        try:
            code = procs[0].wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:  # its stacks said below (PYTHONFAULTHANDLER)
            code = None
            procs[0].send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[0].wait(timeout=20)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs[0].seek(0)
    out = logs[0].read().decode(errors="replace")
    assert procs[1].returncode == -signal.SIGKILL, out
    assert code == 1, f"rank 0 exited {code} (None: still running {HANG_S} s after rank 1 " \
        f"was killed):\n{out[-12000:]}"
    assert "kiln: train stopped: another rank of this launch failed or was killed" in out, out
    assert f"`kiln train {tiny_run}` resumes from the latest" in out
    for noise in ("Traceback", "TCPStore", "frame #"):
        assert noise not in out, out
