"""Ranks that read their own copies of a run (a node's own disk) with other token shards
(one node's re-made) are refused at the start, not trained: each rank would take its slice
of a step from its own data. A resume refused the odd copy against its checkpoint; a new
run has no checkpoint to refuse it against."""

from __future__ import annotations

import json
import shutil

import numpy as np
from conftest import tiny_config
from mp_helpers import run_function_on_ranks

from kiln.hashing import file_sha256


def _start_on_own_dir(rank: int, world_size: int, dirs: list) -> str:
    from kiln.errors import RunDataError
    from kiln.train.trainer import Trainer

    try:
        Trainer(tiny_config(dirs[rank], "train.parallel=ddp"))
    except RunDataError as e:
        return str(e)
    return "started"


def _remade(run_dir) -> None:
    """Two tokens of the train shard swapped, recorded in index.json as `kiln tokenize`
    would: valid shards of the same size, with other contents."""
    shard = run_dir / "tokens" / "train_00000.bin"
    tokens = np.fromfile(shard, dtype=np.uint16)
    at = int(np.flatnonzero(tokens[1:] != tokens[:-1])[0])
    tokens[[at, at + 1]] = tokens[[at + 1, at]]
    tokens.tofile(shard)
    index = json.loads((run_dir / "tokens" / "index.json").read_text())
    index["train"]["shards"][0]["sha256"] = file_sha256(shard)
    (run_dir / "tokens" / "index.json").write_text(json.dumps(index))
    (run_dir / "tokens" / "checked.json").unlink(missing_ok=True)


def test_ranks_holding_different_token_shards_are_refused(tiny_run, tmp_path):
    other = tmp_path / "node1"
    shutil.copytree(tiny_run, other)
    _remade(other)
    said = run_function_on_ranks(_start_on_own_dir, 2, args=([tiny_run, other],), timeout=120)
    for msg in said:
        assert "the ranks hold different token shards" in msg, msg
        assert "rank 0 holds one, rank 1 another" in msg
    # the same copy on both ranks starts
    same = run_function_on_ranks(_start_on_own_dir, 2, args=([other, other],), timeout=120)
    assert same == ["started", "started"]
