"""The ranks' meeting at start-up (`rank_meeting`) takes Ctrl-C and SIGTERM, and a rank 0
that fails before it joined tells the ranks that wait for it. torch's rendezvous waited in
C++ for the group's half hour, deaf to SIGTERM (a Ctrl-C cut a retry short in C++ frames)."""

from __future__ import annotations

import fcntl
import signal
import socket
import time
from pathlib import Path

import pytest
from launch import start_python

from distributed.test_signals_ranks import _ended, _kiln_lines
from kiln.errors import KilnError

# each rank marks itself in marks/ (argv[1]) as it starts to meet the others ("busy"), and
# as it makes its end of the ranks' store ("met": rank 0 of a hand launch hosts it)
MEETING = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a background suite ignores it)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and a suite under nohup, SIGHUP
import torch.distributed as dist
torch_rendezvous = sys.modules["torch.distributed.rendezvous"]  # its attribute: the function
from kiln import cli
from kiln.parallel import distributed
marks = sys.argv[1]
def mark(name):
    open(os.path.join(marks, f"{name}{os.environ['RANK']}"), "w").close()
met, made = distributed._rendezvous, dist.TCPStore
def rendezvous(backend):
    mark("busy")
    return met(backend)
def store(*args, **kwargs):  # Kiln's own (dist.TCPStore), or torch's rendezvous's
    dist.TCPStore = torch_rendezvous.TCPStore = made  # once: `isinstance` checks use the class
    mark("met")
    if os.environ["RANK"] in os.environ.get("SLOW_CONNECT", ""):  # a connect on a loaded node
        import time
        time.sleep(60)
    return made(*args, **kwargs)
distributed._rendezvous = rendezvous
dist.TCPStore = torch_rendezvous.TCPStore = store
if os.environ["RANK"] == os.environ.get("SLOW_POLL"):  # a rank that reads the store late
    from kiln.parallel import rank_meeting
    rank_meeting._POLL_MAX_S = 3.0
sys.exit(cli.main(["train", sys.argv[2]]))
"""


def _script(tmp_path: Path, run_dir: Path) -> list[str]:
    (tmp_path / "marks").mkdir()
    script = tmp_path / "meeting.py"
    script.write_text(MEETING)
    return [str(script), str(tmp_path / "marks"), str(run_dir)]


def _when_marked(tmp_path: Path, procs: list, mark: str, ranks: list[int]) -> None:
    deadline = time.monotonic() + 120
    while not all((tmp_path / "marks" / f"{mark}{r}").exists() for r in ranks):
        assert all(p.poll() is None for p in procs), "a rank ended before the ranks met"
        assert time.monotonic() < deadline, f"the ranks did not reach their mark {mark!r}"
        time.sleep(0.1)
    time.sleep(1)  # from the mark into the wait itself


def _started(tmp_path: Path, procs: list, ranks: list[int]) -> None:
    """Until each of `procs` (of RANK `ranks`) has started: marked "busy" as it goes to meet
    the others, or ended (refused before). `_ended` gives the ranks HANG_S from there, to
    meet and stop: counted from their launch, it held a start-up (importing torch), which
    on a loaded machine took most of it."""
    deadline = time.monotonic() + 120
    while not all(p.poll() is not None or (tmp_path / "marks" / f"busy{r}").exists()
                  for p, r in zip(procs, ranks)):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)


def _one_line(said: str, start: str) -> None:
    assert "Traceback" not in said and "frame #" not in said, said[-3000:]
    lines = _kiln_lines(said)
    assert len(lines) == 1 and lines[0].startswith(start), said[-3000:]


def test_a_rank_waiting_for_rank_zero_to_start_stops_on_sigterm(tiny_run, tmp_path):
    """Rank 1 of a hand launch whose rank 0 never came: it stops on SIGTERM with its line
    and status, where it sat in TCPStore's connect, retried in C++ for half an hour."""
    procs, logs = start_python(_script(tmp_path, tiny_run), world_size=2, ranks=[1])
    try:
        _when_marked(tmp_path, procs, "busy", [1])
        procs[0].send_signal(signal.SIGTERM)
    finally:
        [(rank1, said1)] = _ended(procs, logs)
    assert rank1 == 143, said1[-3000:]
    _one_line(said1, "kiln: train stopped on SIGTERM; ")


@pytest.mark.parametrize("slow_connect", [False, True], ids=["met", "slow connect"])
def test_a_rank_stopped_while_the_ranks_meet_stops_those_waiting_with_it(tiny_run, tmp_path,
                                                                         monkeypatch, slow_connect):
    """Ranks 0 and 1 of 3 meet, rank 2 never comes; a SIGTERM to rank 1 stops it, and rank 0
    with it (its word left in the store), each with one line and SIGTERM's status. Both sat
    deaf before: rank 0 in its store's wait for every rank, rank 1 in the group's. With its
    end of the store slow to make (a loaded node: the signal is taken once the connect
    returns, before the wait that leaves word), rank 1 stopped and rank 0 waited for it until
    the meeting's timeout (half an hour): it leaves its word all the same."""
    if slow_connect:
        monkeypatch.setenv("SLOW_CONNECT", "1")
    procs, logs = start_python(_script(tmp_path, tiny_run), world_size=3, ranks=[0, 1])
    try:
        _when_marked(tmp_path, procs, "met", [0, 1])
        procs[1].send_signal(signal.SIGTERM)
    finally:
        (rank0, said0), (rank1, said1) = _ended(procs, logs)
    assert (rank0, rank1) == (143, 143), said0[-3000:] + said1[-3000:]
    _one_line(said1, "kiln: train stopped on SIGTERM; ")
    _one_line(said0, "kiln: train stopped: rank 1 stopped on SIGTERM before the ranks met; ")


def test_a_rank_refused_before_it_met_stops_every_rank_waiting_with_its_reason(
        tiny_run, tmp_path, monkeypatch):
    """Ranks 0 and 2 of 3 meet; rank 1 is refused before it joins (no run directory on its
    node) and leaves word in rank 0's store. Rank 0 reads it first and stops, staying until
    the ranks here have read it: rank 1 was counted among them, so rank 0 left before rank 2
    read it, and rank 2 met a store gone, not the reason."""
    import os
    import subprocess
    import sys
    import tempfile

    from launch import free_port

    monkeypatch.setenv("SLOW_POLL", "2")
    args, port, procs, logs = _script(tmp_path, tiny_run), free_port(), {}, {}

    def start(rank: int, run_dir: Path) -> None:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "3",
               "OMP_NUM_THREADS": "1"}  # each on a node of its own: each says its line
        logs[rank] = tempfile.TemporaryFile()
        procs[rank] = subprocess.Popen([sys.executable, *args[:2], str(run_dir)], env=env,
                                       stdout=logs[rank], stderr=subprocess.STDOUT)

    start(0, tiny_run)
    start(2, tiny_run)
    try:
        _when_marked(tmp_path, list(procs.values()), "met", [0, 2])
        time.sleep(2)  # both here, polling
        start(1, tmp_path / "not-on-this-node")
        _started(tmp_path, [procs[1]], [1])
    finally:
        ended = dict(zip(sorted(procs), _ended([procs[r] for r in sorted(procs)],
                                               [logs[r] for r in sorted(procs)])))
    (code0, said0), (code1, said1), (code2, said2) = ended[0], ended[1], ended[2]
    why = f"no recipe or run directory at {tmp_path / 'not-on-this-node'}"
    assert code1 == 2, said1[-3000:]
    _one_line(said1, f"kiln: config error: {why}")
    for code, said in ((code0, said0), (code2, said2)):
        assert code == 1, said[-3000:]
        _one_line(said, f"kiln: rank 1 failed before the ranks met: {why}")


def test_rank_zero_refused_by_the_training_lock_tells_the_waiting_ranks(tiny_run, tmp_path):
    """Rank 0 of a hand launch refused before it joined (another trainer holds the run's
    lock): rank 1 hears why from it and fails with it, where it waited half an hour."""
    with open(tiny_run / ".train.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 on elsewhere")
        held.flush()
        procs, logs = start_python(_script(tmp_path, tiny_run), world_size=2)
        try:
            _started(tmp_path, procs, [0, 1])
        finally:
            (rank0, said0), (rank1, said1) = _ended(procs, logs)
    assert (rank0, rank1) == (1, 1), said0[-3000:] + said1[-3000:]
    _one_line(said0, f"kiln: {tiny_run} is being trained by pid 1 on elsewhere")
    _one_line(said1, f"kiln: rank 0 failed before the ranks met: {tiny_run} is being trained "
                     "by pid 1 on elsewhere")


def test_a_wait_for_rank_zero_past_its_timeout_names_the_likely_causes():
    from kiln.parallel import rank_meeting

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(KilnError) as e:
            rank_meeting._wait_for_the_host("127.0.0.1", port, 1, deadline=time.monotonic())
    assert f"rank 1 waited 0 s for rank 0 at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT) and " \
           "gave up: rank 0 has not started, or stopped before it joined" in str(e.value)



def _hand_launch(tmp_path: Path, run_dir: Path, ranks: list[tuple[int, int]]):
    """A hand launch of `ranks` as (RANK, WORLD_SIZE) pairs, each its own, on one port."""
    import os
    import subprocess
    import sys
    import tempfile

    from launch import free_port

    args, port = _script(tmp_path, run_dir), free_port()
    procs, logs = [], []
    for rank, world in ranks:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "OMP_NUM_THREADS": "1"}
        logs.append(tempfile.TemporaryFile())
        (tmp_path / "marks" / f"busy{rank}").unlink(missing_ok=True)  # a RANK given twice
        procs.append(subprocess.Popen([sys.executable, *args], env=env, stdout=logs[-1],
                                      stderr=subprocess.STDOUT))
        # each started before the next: a rank given twice is the second to meet (which
        # rank sets the launch's WORLD_SIZE, rank 0's, no longer depends on the order)
        try:
            _started(tmp_path, procs[-1:], [rank])
        except AssertionError:
            _ended(procs, logs)  # not left running
            raise
    return procs, logs


@pytest.mark.parametrize("ranks, why", [
    ([(0, 2), (1, 3)], "rank 1 was started with WORLD_SIZE=3, another rank of this launch "
                       "with 2"),
    ([(1, 2), (0, 3)], "rank 1 was started with WORLD_SIZE=2, another rank of this launch "
                       "with 3"),
    ([(0, 2), (2, 2)], "rank 2 is out of range: RANK must be 0 to 1 (WORLD_SIZE=2)"),
    ([(0, 3), (1, 3), (1, 3)], "rank 1 was started twice"),
], ids=["larger", "smaller", "out of range", "twice"])
def test_a_rank_that_does_not_fit_the_launch_stops_every_rank(tiny_run, tmp_path, ranks, why):
    """A hand launch whose ranks disagree on WORLD_SIZE, or a RANK out of range or given
    twice: the meeting's count was reached all the same, and the ranks went on into the
    group's C++ connect, deaf to SIGTERM, each waiting there for a rank that never came, for
    the group's half hour. Every rank stops, the one that does not fit saying why, the
    others naming it."""
    procs, logs = _hand_launch(tmp_path, tiny_run, ranks)
    ended = _ended(procs, logs)
    assert all(code not in (None, 0) for code, _ in ended), ended
    said = "\n".join(out for _, out in ended)
    assert "Traceback" not in said and "frame #" not in said, said[-3000:]
    assert f"kiln: config error: {why}" in said, said[-3000:]
    head = why.split(":")[0]  # every rank names the one that does not fit
    assert all(head in out for _, out in ended), said[-3000:]


CLI = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a background suite ignores it)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and a suite under nohup, SIGHUP
from kiln import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("refused", [1, 0])
def test_an_early_check_refused_on_one_rank_alone_stops_the_other(tmp_path, refused):
    """A hand launch of `kiln run` whose one rank is refused by a check before the ranks
    meet (its --set differs: a batch the ranks cannot share): the other, whose checks
    passed, waited to meet it for the group's half hour (rank 0 hosting the meeting, or
    rank 1 polling rank 0's port). It stops now with the refused rank's reason."""
    import os
    import subprocess
    import sys
    import tempfile

    from conftest import TINY
    from launch import free_port

    from distributed.test_signals_ranks import REPO

    script = tmp_path / "cli.py"
    script.write_text(CLI)
    port, procs, logs = free_port(), [], []
    for rank in (0, 1):
        batch = ["--set", "train.global_batch=7"] if rank == refused else []
        args = ["run", str(REPO / "recipes" / "quickstart.toml"),
                *[a for kv in [*TINY, f'run.dir="{tmp_path / "run"}"'] for a in ("--set", kv)],
                *batch]
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1"}  # each on a node of its own: both say their line
        logs.append(tempfile.TemporaryFile())
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env,
                                      stdout=logs[-1], stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 180  # both start (torch imported), one is refused
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)  # the other waited half an hour for it
    ended = _ended(procs, logs)
    (code_refused, said_refused), (code_other, said_other) = \
        ended[refused], ended[1 - refused]
    why = "train.global_batch (7) must be divisible by the number of ranks"
    assert code_refused == 2, said_refused[-3000:]
    _one_line(said_refused, f"kiln: config error: {why}")
    assert code_other == 1, said_other[-3000:]
    _one_line(said_other, f"kiln: rank {refused} failed before the ranks met: {why}")
