"""A rank that waits for a slower one at a resume (rank 0 still reading a large checkpoint)
takes SIGTERM and Ctrl-C: the ranks agree on the read in a polled wait
(`run_on_every_rank`). Rank 1 sat in the scatter of `set_model_state_dict`, a blocking gloo
collective that held the signal back until rank 0 came."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import tiny_config

from distributed.test_signals_ranks import _kiln_lines, _rank_one_signalled_alone, _signalled
from kiln.train.trainer import Trainer

SLOW_RANK_ZERO = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a background suite ignores it)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and a suite under nohup, SIGHUP
from kiln import cli
from kiln.parallel import rank_waits
from kiln.train import checkpoint
marks = sys.argv[1]
rank_waits.STOP_GRACE_S = 2.0
def mark(name):
    open(os.path.join(marks, f"{name}{os.environ['RANK']}"), "w").close()
checked = checkpoint.verified
def verified(path, name):  # rank 0's copy on a slow disk: a sleep stops on a signal as reading does
    mark("busy")
    if os.environ["RANK"] == "0":
        time.sleep(120)
    return checked(path, name)
checkpoint.verified = verified
sys.exit(cli.main(["train", sys.argv[2], "--set", "train.parallel=fsdp"]))
"""


@pytest.fixture
def slow_resume(tiny_run, tmp_path) -> list[str]:
    """The script and its arguments: a resume of a step-6 checkpoint on 2 ranks, rank 0's
    reading of it slow."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=6")).fit()
    (tmp_path / "marks").mkdir()
    script = tmp_path / "slow_rank_zero.py"
    script.write_text(SLOW_RANK_ZERO)
    return [str(script), str(tmp_path / "marks"), str(tiny_run)]


def test_a_rank_waiting_for_rank_zeros_resume_stops_on_sigterm(slow_resume, tmp_path):
    """A `kill` of rank 1 alone: it stops after its grace with SIGTERM's status and line,
    while rank 0 reads on."""
    rank0_busy, rank1, said0, said1 = _rank_one_signalled_alone(slow_resume, tmp_path, signal.SIGTERM)
    assert rank1 == 143, said1[-2000:]
    assert rank0_busy, said0[-2000:]
    assert "Traceback" not in said1, said1
    lines = _kiln_lines(said1)
    assert len(lines) == 1 and lines[0].startswith("kiln: train stopped on SIGTERM; "), said1


def test_sigterm_to_every_rank_in_a_slow_resume_is_one_line(slow_resume, tmp_path):
    """A scheduler's SIGTERM reaches every rank: rank 0 stops in its reading and tells the
    others, which stop with its status, silent (its node's line is rank 0's)."""
    (rank0, said0), (rank1, said1) = _signalled(slow_resume, tmp_path, [0, 1])
    assert (rank0, rank1) == (143, 143), said0[-2000:] + said1[-2000:]
    assert "Traceback" not in said0 + said1, said0[-2000:] + said1[-2000:]
    lines = _kiln_lines(said0)
    assert len(lines) == 1 and lines[0].startswith("kiln: train stopped on SIGTERM; "), said0
    assert _kiln_lines(said1) == [], said1


# the rare end of a rank that said its line, made certain (seen in a core dump): gloo's work
# thread lets go of a finished collective late (~AsyncAllgatherWork), and the last reference
# to its tensors' Python objects needs the GIL; taken back in the interpreter's teardown, a
# thread is ended (pthread_exit) inside that C++ destructor: std::terminate, SIGABRT. Here a
# thread of the same kind, woken by the teardown's last collection: every time.
LATE_NATIVE_THREAD = """
code = cli.main(["train", sys.argv[2], "--set", "train.parallel=fsdp"])
import threading
import torch.distributed as dist
woken = dist.HashStore()
threading.Thread(target=lambda: woken.wait(["teardown"]), daemon=True).start()  # C++, no GIL
class Late:
    def __del__(self):  # in the teardown's collection
        woken.set("teardown", "1")
        time.sleep(0.2)  # the GIL let go: the thread takes it back, in the teardown
late = Late()
late.cycle = late
del late
sys.exit(code)
"""


def test_ranks_stopped_in_a_slow_resume_end_with_their_status_past_a_late_native_thread(
        slow_resume, tmp_path):
    """Rank 0, its line said, now and then aborted on its way out (1 run in ~30 on a loaded
    machine: SIGABRT, "terminate called without an active exception"). A rank that joined a
    group now ends at once when its line is said (`leave_the_process`): no teardown runs for
    a thread to meet."""
    script, *args = slow_resume
    late = tmp_path / "late_native_thread.py"
    body = Path(script).read_text()
    ending = 'sys.exit(cli.main(["train", sys.argv[2], "--set", "train.parallel=fsdp"]))\n'
    assert ending in body
    late.write_text(body.replace(ending, LATE_NATIVE_THREAD))
    (rank0, said0), (rank1, said1) = _signalled([str(late), *args], tmp_path, [0, 1])
    assert (rank0, rank1) == (143, 143), said0[-2000:] + said1[-2000:]
    assert "terminate called" not in said0 + said1, said0[-2000:] + said1[-2000:]
    lines = _kiln_lines(said0)
    assert len(lines) == 1 and lines[0].startswith("kiln: train stopped on SIGTERM; "), said0
