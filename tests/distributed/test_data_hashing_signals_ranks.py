"""A rank that waits for a slower one to hash the token shards (rank 0's copy on a slow
disk, its stat changed since they were last checked) takes SIGTERM: the ranks agree on
their data in a polled wait (`run_on_every_rank`). Rank 1 sat in the gather of
`_refuse_other_shards`, a blocking gloo collective, deaf until rank 0 came."""

from __future__ import annotations

import signal

import pytest

from distributed.test_signals_ranks import _kiln_lines, _rank_one_signalled_alone, _signalled

SLOW_HASH = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a background suite ignores it)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and a suite under nohup, SIGHUP
from kiln import cli
from kiln.data import shard_hashes
from kiln.parallel import rank_waits
marks = sys.argv[1]
rank_waits.STOP_GRACE_S = 2.0
def mark(name):
    open(os.path.join(marks, f"{name}{os.environ['RANK']}"), "w").close()
hashed = shard_hashes.file_sha256
def file_sha256(path):  # rank 0's shards on a slow disk: a sleep stops on a signal as reading does
    # the other ranks hash once rank 0 began: one done first (rank 0 slow to start, under load)
    # recorded the shards checked in checked.json, and rank 0 then hashed nothing, trained
    if os.environ["RANK"] != "0":
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(marks, "busy0")):
            assert time.monotonic() < deadline, "rank 0 did not hash"
            time.sleep(0.05)
    mark("busy")
    if os.environ["RANK"] == "0":
        time.sleep(120)
    return hashed(path)
shard_hashes.file_sha256 = file_sha256
sys.exit(cli.main(["train", sys.argv[2], "--set", "train.parallel=ddp"]))
"""


@pytest.fixture
def slow_hash(tiny_run, tmp_path) -> list[str]:
    """The script and its arguments: a new run on 2 ranks whose shards were not checked
    at this stat (a fresh copy), rank 0's hashing of them slow."""
    (tiny_run / "tokens" / "checked.json").unlink()
    (tmp_path / "marks").mkdir()
    script = tmp_path / "slow_hash.py"
    script.write_text(SLOW_HASH)
    return [str(script), str(tmp_path / "marks"), str(tiny_run)]


def test_a_rank_waiting_for_rank_zeros_shard_hashing_stops_on_sigterm(slow_hash, tmp_path):
    """A `kill` of rank 1 alone: it stops after its grace with SIGTERM's status and line,
    while rank 0 hashes on."""
    rank0_busy, rank1, said0, said1 = _rank_one_signalled_alone(slow_hash, tmp_path, signal.SIGTERM)
    assert rank1 == 143, said1[-2000:]
    assert rank0_busy, said0[-2000:]
    assert "Traceback" not in said1, said1
    lines = _kiln_lines(said1)
    assert len(lines) == 1 and lines[0].startswith("kiln: train stopped on SIGTERM; "), said1


def test_sigterm_to_every_rank_while_rank_zero_hashes_is_one_line(slow_hash, tmp_path):
    """A scheduler's SIGTERM reaches every rank: rank 0 stops in its hashing and tells the
    other, which stops with its status, silent (its node's line is rank 0's); it said a
    lost rank before ("another rank of this launch failed or was killed"), status 1."""
    (rank0, said0), (rank1, said1) = _signalled(slow_hash, tmp_path, [0, 1])
    assert (rank0, rank1) == (143, 143), said0[-2000:] + said1[-2000:]
    assert "Traceback" not in said0 + said1, said0[-2000:] + said1[-2000:]
    lines = _kiln_lines(said0)
    assert len(lines) == 1 and lines[0].startswith("kiln: train stopped on SIGTERM; "), said0
    assert _kiln_lines(said1) == [], said1


def test_a_damaged_shard_on_one_rank_is_said_by_every_rank(tiny_run, tmp_path):
    """One node's own copy of the shards damaged: every rank stops naming the rank and the
    shard, where the others met a lost rank (or, on a slow disk, waited deaf for it)."""
    import shutil

    from mp_helpers import run_function_on_ranks

    from distributed.test_shard_copies_ranks import _start_on_own_dir

    other = tmp_path / "node1"
    shutil.copytree(tiny_run, other)
    shard = other / "tokens" / "train_00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    said = run_function_on_ranks(_start_on_own_dir, 2, args=([tiny_run, other],), timeout=120)
    for msg in said:
        assert msg.startswith("rank 1 cannot train on its data: "), msg
        assert f"{shard} is not the shard `kiln tokenize` wrote" in msg, msg
