"""`kiln eval` under torchrun scores one checkpoint on every rank: rank 0's latest. A trainer
of the run writes checkpoints while it is evaluated, and ranks that read `latest` a moment
apart each scored another model, their losses summed into one figure."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config
from mp_helpers import run_function_on_ranks

from kiln.train.trainer import Trainer


def _eval_with_rank_one_early(rank: int, world_size: int, run_dir) -> None:
    import kiln.train.trained_run as trained_run
    from kiln.commands.evaluate import cmd_eval

    if rank == 1:  # it read `latest` just before step 6's checkpoint was pointed to
        trained_run.latest_checkpoint = lambda root: root / "step_00000003"
    cmd_eval(tiny_config(run_dir), distributed=True)


def test_every_rank_scores_rank_zeros_checkpoint(tiny_run):
    from kiln.commands.evaluate import cmd_eval

    Trainer(tiny_config(tiny_run, "train.steps=6", "train.checkpoint_every=3")).fit()
    cmd_eval(tiny_config(tiny_run))  # one process: step 6
    one = json.loads((tiny_run / "eval.json").read_text())
    run_function_on_ranks(_eval_with_rank_one_early, 2, args=(tiny_run,), timeout=120)
    two = json.loads((tiny_run / "eval.json").read_text())
    assert two["ranks"] == 2 and two["checkpoint"] == one["checkpoint"] == "step_00000006"
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
