"""`kiln eval`'s per-window losses on 2 and 3 gloo ranks: each rank keeps only its own
windows and rank 0 gathers them, a chunk at a time, into the split's order."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import run_python

from kiln.data.loader import eval_batches

SCRIPT = Path(__file__).with_name("window_gather_rank.py")


@pytest.mark.parametrize("world, batch_size, max_batches, per_call", [
    (2, 3, 0, 3),      # every batch its own gather; the last batch short
    (3, 4, 0, 1),      # fewer windows per call than a batch: one batch per call
    (2, 5, 3, 1 << 20),  # an odd number of batches (rank 1 pads a row), one call
])
def test_the_gathered_windows_are_in_the_splits_order(tiny_run, world, batch_size,
                                                      max_batches, per_call):
    token_dir = tiny_run / "tokens"
    scored = eval_batches(token_dir, "val", 32, batch_size, max_batches).scored_windows
    assert scored > world * batch_size  # more than one row per rank
    out = run_python([str(SCRIPT), str(token_dir), "32", str(batch_size), str(max_batches),
                      str(per_call)], world_size=world, timeout=120)
    assert f"gathered {scored} windows in order" in out
