"""Signals for the ranks of a `kiln run` while rank 0 alone makes the data and the others
wait: a scheduler's SIGTERM stops every rank as Ctrl-C does (one line, exit 143, no
traceback), and a waiting rank takes Ctrl-C, which a blocking gloo collective held back."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY
from launch import free_port, start_python

REPO = Path(__file__).resolve().parents[2]
HANG_S = 30  # a rank still running this long after its signal is taken for hung

# both scripts' ranks mark themselves busy in marks/ (argv[1]): rank 0 in its data stages
# (each script's own), the other ranks as they enter the wait for rank 0 (`mark_the_wait`)
RANK_MARKS = """
import os, sys, time
from kiln import cli
from kiln.commands import run as run_chain
from kiln.parallel import rank_waits
marks = sys.argv[1]
def mark(name):
    open(os.path.join(marks, f"{name}{os.environ['RANK']}"), "w").close()
def mark_the_wait():
    waited = rank_waits.run_on_main
    def run_on_main(*args, **kwargs):
        mark("busy")
        return waited(*args, **kwargs)
    rank_waits.run_on_main = run_on_main  # where `kiln run` looks it up
"""

SLOW_DATA = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a background suite ignores it)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and a suite under nohup, SIGHUP
""" + RANK_MARKS + """
rank_waits.STOP_GRACE_S = float(os.environ.get("KILN_TEST_GRACE", "15"))
if os.environ["RANK"] == "0":
    def prepare(cfg):  # hours of data on rank 0: a sleep stops on a signal's exception as they do
        mark("busy")
        time.sleep(120)
    run_chain.cmd_prepare = prepare
else:
    mark_the_wait()
sys.exit(cli.main(sys.argv[2:]))
"""


EXIT_STATUS = """
import os, signal, subprocess, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # torchrun signals the rank's
    signal.signal(sig, lambda *a: None)  # whole group: the rank's own status is the one to record
code = subprocess.call([sys.executable, *sys.argv[2:]])
with open(os.path.join(sys.argv[1], f"exit{os.environ['RANK']}"), "w") as f:
    f.write(str(code))
sys.exit(0)
"""


def _script(tmp_path: Path) -> list[str]:
    """The slow-data script and its arguments: a `kiln run` of the tiny recipe on two ranks."""
    script = tmp_path / "slow_data.py"
    script.write_text(SLOW_DATA)
    marks = tmp_path / "marks"
    marks.mkdir()
    sets = [a for kv in [*TINY, "train.parallel=ddp", f'run.dir="{tmp_path / "run"}"']
            for a in ("--set", kv)]
    return [str(script), str(marks), "run", str(REPO / "recipes" / "quickstart.toml"), *sets]


def _said(logs: list) -> str:
    """The tail of each rank's output so far, for a failure's message."""
    said = []
    for rank, log in enumerate(logs):
        log.seek(0)
        said.append(f"rank {rank}: {log.read().decode(errors='replace')[-2000:]}")
    return "\n".join(said)


def _when_busy(tmp_path: Path, procs: list[subprocess.Popen], logs: list | None = None,
               ranks: int = 2) -> None:
    """Until rank 0 is in its data stages and the others wait for it."""
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "marks").glob("busy*"))) < ranks:
        assert all(p.poll() is None for p in procs), (
            f"a rank ended before the data stages (exit {[p.poll() for p in procs]})\n"
            + _said(logs or []))
        assert time.monotonic() < deadline, "the ranks did not reach the data stages"
        time.sleep(0.1)
    time.sleep(1)  # the waiting rank from its mark into the wait itself


def _ended(procs: list[subprocess.Popen], logs: list) -> list[tuple[int | None, str]]:
    """Each rank's exit status (None: still running after HANG_S, then killed) and output."""
    deadline = time.monotonic() + HANG_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    codes = [p.poll() for p in procs]
    out = []
    for p, log in zip(procs, logs):
        if p.poll() is None:
            p.kill()
        p.wait()
        log.seek(0)
        out.append(log.read().decode(errors="replace"))
        log.close()
    return list(zip(codes, out))


def _kiln_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("kiln:")]


def _signalled(script: list[str], tmp_path: Path, ranks: list[int],
               sig: int = signal.SIGTERM) -> list[tuple[int | None, str]]:
    """Launch `script` on 2 ranks, send `sig` to `ranks` once both are busy, and return
    each rank's exit status and output (`_ended`)."""
    procs, logs = start_python(script, world_size=2)
    try:
        _when_busy(tmp_path, procs, logs)
        for rank in ranks:
            procs[rank].send_signal(sig)
    finally:
        ended = _ended(procs, logs)
    return ended


def _rank_one_signalled_alone(script: list[str], tmp_path: Path,
                              sig: int) -> tuple[bool, int | None, str, str]:
    """Launch `script` on 2 ranks and send `sig` to rank 1 alone once both are busy: whether
    rank 0 was still busy when rank 1 ended (or HANG_S passed), rank 1's status, and both
    ranks' output (rank 0 killed then)."""
    procs, logs = start_python(script, world_size=2)
    try:
        _when_busy(tmp_path, procs, logs)
        procs[1].send_signal(sig)
        deadline = time.monotonic() + HANG_S
        while procs[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        rank0_busy = procs[0].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        (_, said0), (rank1, said1) = _ended(procs, logs)
    return rank0_busy, rank1, said0, said1


@pytest.mark.parametrize("signalled", [[0, 1], [0]], ids=["every rank", "rank 0"])
def test_sigterm_in_the_data_stages_stops_every_rank_with_one_line(tmp_path, signalled):
    """SLURM's SIGTERM reaches every rank; a `kill` may reach rank 0 alone. Rank 0's data
    stages stop as on Ctrl-C and it says so once; the waiting rank learns it from rank 0
    and stops with the same status, silent (its node's line is rank 0's). Both died of the
    signal at once before, without a word."""
    (rank0, said0), (rank1, said1) = _signalled(_script(tmp_path), tmp_path, signalled)
    assert (rank0, rank1) == (143, 143), said0[-2000:] + said1[-2000:]
    assert "Traceback" not in said0 + said1, said0[-2000:] + said1[-2000:]
    lines = _kiln_lines(said0)
    assert len(lines) == 1 and lines[0].startswith("kiln: run stopped on SIGTERM; "), said0
    assert "`kiln run` again with the same recipe and --set options goes on" in lines[0]
    assert _kiln_lines(said1) == [], said1


def test_ctrl_c_reaches_a_rank_waiting_for_rank_zero(tmp_path, monkeypatch):
    """A hand launch, Ctrl-C in rank 1's terminal alone: rank 1 waits a short grace for
    rank 0 to stop too (it would say how rank 0 ended), then stops as interrupted. It used
    to sit in gloo's broadcast with the signal held back until rank 0's data was made."""
    monkeypatch.setenv("KILN_TEST_GRACE", "2")
    rank0_busy, rank1, said0, said1 = _rank_one_signalled_alone(
        _script(tmp_path), tmp_path, signal.SIGINT)
    assert rank1 == 130, said1[-2000:]
    assert rank0_busy, said0[-2000:]  # rank 0's terminal had no Ctrl-C: its work goes on
    assert "Traceback" not in said1, said1
    lines = _kiln_lines(said1)
    assert len(lines) == 1 and lines[0].startswith("kiln: run interrupted; "), said1


def _torchrun(tmp_path: Path, args: list[str]) -> subprocess.Popen:
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable),
                                                        "torchrun")
    log = open(tmp_path / "torchrun.log", "w+b")  # noqa: SIM115  # closed by the test
    return subprocess.Popen(
        [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "--tee", "3", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGTERM, 143, "kiln: run stopped on SIGTERM; "),
    (signal.SIGINT, 130, "kiln: run interrupted; "),
    (signal.SIGHUP, 129, "kiln: run stopped on SIGHUP; "),  # the terminal of torchrun closed
], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_to_torchrun_in_the_data_stages_ends_each_rank_cleanly(tmp_path, sig, code,
                                                                        said):
    """torchrun passes a signal it gets on to its ranks (then SIGTERMs the others as soon
    as one exits): each rank ends with the signal's status, neither killed in its exit nor
    aborted by gloo, and the one line is rank 0's."""
    status = tmp_path / "exit_status.py"
    status.write_text(EXIT_STATUS)
    launcher = _torchrun(tmp_path, [str(status), str(tmp_path), *_script(tmp_path)])
    try:
        _when_busy(tmp_path, [launcher])
        launcher.send_signal(sig)
        launcher.wait(timeout=HANG_S)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    output = (tmp_path / "torchrun.log").read_text(errors="replace")
    ranks = {r: [line.split(":", 1)[1] for line in output.splitlines()
                 if line.startswith(f"[default{r}]:")] for r in (0, 1)}
    assert not any("Traceback" in line for lines in ranks.values() for line in lines), output
    assert [line for line in ranks[0] if line.startswith("kiln:")] == \
        [next(line for line in ranks[0] if line.startswith(said))], output
    assert not any(line.startswith("kiln:") for line in ranks[1]), output
    assert [(tmp_path / f"exit{r}").read_text() for r in (0, 1)] == [str(code)] * 2, output


STOPPED_ALONE = RANK_MARKS + """
rank_waits.STOP_GRACE_S = 1.0
if os.environ["RANK"] == "0":
    def gone(pid):  # ended: a zombie, until the test waits for it
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True
    def data_stages(stages, cfg):  # rank 0's data stages go on until rank 1 has gone
        mark("busy")
        deadline, pid = time.monotonic() + 60, os.path.join(marks, "pid1")
        while not (os.path.exists(pid) and gone(open(pid).read())):
            assert time.monotonic() < deadline, "rank 1 did not stop"
            time.sleep(0.05)
        time.sleep(0.5)  # its connections' close reaches gloo
    run_chain._timed = data_stages
    run_chain.record_config = run_chain.refuse_prompts_that_do_not_fit = lambda cfg: None
else:
    with open(os.path.join(marks, "pid1"), "w") as f:
        f.write(str(os.getpid()))
    mark_the_wait()
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_waiting_rank_stopped_alone_is_named_by_rank_zero(tmp_path):
    """A `kill` of rank 1 alone while rank 0 makes the data (a hand launch): rank 1 stops
    after its grace; rank 0 meets its absence at the next collective, and said "another rank
    of this launch failed or was killed ([/__w/pytorch/.../pair.cc:553] Connection closed by
    peer ... Check the logs of the remote w)", cut mid-word. Now it names the rank and its
    signal."""
    args = _script(tmp_path)
    (tmp_path / "stopped_alone.py").write_text(STOPPED_ALONE)
    args[0] = str(tmp_path / "stopped_alone.py")
    procs, logs = start_python(args, world_size=2)
    try:
        _when_busy(tmp_path, procs, logs)
        procs[1].send_signal(signal.SIGTERM)
    finally:
        (rank0, said0), (rank1, said1) = _ended(procs, logs)
    assert (rank0, rank1) == (1, 143), said0[-2000:] + said1[-2000:]
    assert "Traceback" not in said0 + said1, said0[-2000:] + said1[-2000:]
    lines = _kiln_lines(said0)
    assert len(lines) == 1 and lines[0].startswith(
        "kiln: run stopped: rank 1 stopped on SIGTERM (a signal to it alone) while this rank "
        "went on, and this launch cannot go on without it; "), said0
    assert _kiln_lines(said1) == ["kiln: run stopped on SIGTERM; " + lines[0].split("; ", 1)[1]]
