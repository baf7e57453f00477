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


FAILS_ON_RANK_ONE = """
import os, sys
from kiln.cli import main
from kiln.errors import CheckpointError
from kiln.train import trained_run
if os.environ["RANK"] == "1":  # its read alone fails: a trainer pruned the checkpoint meanwhile
    def pruned(model_cfg, ckpt):
        raise CheckpointError(f"checkpoint {ckpt} was removed while it was read")
    trained_run.loaded_model = pruned  # where load_trained_model looks it up
sys.exit(main(["eval", sys.argv[1]]))
"""


def test_a_load_failing_on_rank_one_alone_is_said_by_rank_zero(tiny_run, tmp_path):
    """Said by rank 0 for every rank, once: rank 1's own line was left out as an error met
    alike past the first rank of its node, and rank 0 said only that a rank was lost."""
    from launch import run_python

    Trainer(tiny_config(tiny_run, "train.steps=3", "train.checkpoint_every=3")).fit()
    script = tmp_path / "fails_on_rank_one.py"
    script.write_text(FAILS_ON_RANK_ONE)
    with pytest.raises(RuntimeError) as failed:
        run_python([str(script), str(tiny_run)], world_size=2, timeout=120)
    said = str(failed.value)
    assert "rank 0 exited 1:" in said and "rank 1 exited 1:" in said, said
    assert said.count("kiln: rank 1 could not evaluate: checkpoint ") == 1, said
    assert "was removed while it was read" in said and "another rank" not in said


def _eval_with_rank_zero_early(rank: int, world_size: int, run_dir) -> str:
    """`kiln eval` on 2 ranks, rank 0 looking just before the trainer's first checkpoint
    was written, rank 1 after: the error each rank raises (its type and message)."""
    import kiln.train.checkpoint_dirs as checkpoint_dirs
    import kiln.train.trained_run as trained_run
    from kiln.commands.evaluate import cmd_eval

    if rank == 0:
        checkpoint_dirs.latest_checkpoint = trained_run.latest_checkpoint = lambda root: None
    try:
        cmd_eval(tiny_config(run_dir), distributed=True)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "scored"


def test_no_checkpoint_found_by_rank_zero_is_none_for_every_rank(tiny_run):
    """Rank 0 found none: each rank looked again, and rank 1, finding the trainer's first
    checkpoint meanwhile, read it while rank 0 failed (its error said as rank 0's failure
    to read a checkpoint). Every rank now stops with rank 0's finding."""
    Trainer(tiny_config(tiny_run, "train.steps=3", "train.checkpoint_every=3")).fit()
    said = run_function_on_ranks(_eval_with_rank_zero_early, 2, args=(tiny_run,), timeout=120)
    for msg in said:
        assert msg.startswith(f"FileNotFoundError: no checkpoint in {tiny_run / 'checkpoints'}"), \
            said


def _eval_on_own_dir(rank: int, world_size: int, dirs: list) -> str:
    from kiln.commands.evaluate import cmd_eval

    try:
        cmd_eval(tiny_config(dirs[rank]), distributed=True)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "scored"


def test_ranks_holding_different_copies_of_the_checkpoint_are_refused(tiny_run, tmp_path):
    """Each rank reads its own copy of the run (a node's own disk), the copies holding
    other models under the same checkpoint name: each rank scored its own model, their
    losses summed into one figure in eval.json. Refused on every rank now; the same copy
    on both ranks scores."""
    import shutil

    other = tmp_path / "node1"
    shutil.copytree(tiny_run, other)
    for run_dir, lr in ((tiny_run, "1e-3"), (other, "3e-3")):
        Trainer(tiny_config(run_dir, "train.steps=3", "train.checkpoint_every=3",
                            f"optim.lr={lr}")).fit()
    said = run_function_on_ranks(_eval_on_own_dir, 2, args=([tiny_run, other],), timeout=120)
    for msg in said:
        assert msg.startswith("CheckpointError: the ranks hold different copies of checkpoint "
                              "step_00000003"), said
        assert "rank 0 holds one, rank 1 another" in msg, said
    same = run_function_on_ranks(_eval_on_own_dir, 2, args=([other, other],), timeout=120)
    assert same == ["scored", "scored"]


def test_a_damaged_shard_on_one_ranks_copy_is_said_by_every_rank(tiny_run, tmp_path):
    """One node's own copy of the val shard damaged: every rank stops naming the rank and
    the shard, where the others met a lost rank in their first collective (or, on a slow
    disk, waited deaf to SIGTERM while it hashed)."""
    import shutil

    Trainer(tiny_config(tiny_run, "train.steps=3", "train.checkpoint_every=3")).fit()
    other = tmp_path / "node1"
    shutil.copytree(tiny_run, other)
    shard = other / "tokens" / "val_00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    said = run_function_on_ranks(_eval_on_own_dir, 2, args=([tiny_run, other],), timeout=120)
    for msg in said:
        assert msg.startswith("RunDataError: rank 1 could not evaluate: "), said
        assert f"{shard} is not the shard `kiln tokenize` wrote" in msg, said


def test_eval_json_not_written_on_rank_zero_fails_every_rank(tiny_run, tmp_path):
    """Rank 0 alone writes eval.json, after the others had exited 0: its failure to write
    it (here eval.json is a folder) exited rank 0 with 1 and the others with 0. Every rank
    now exits alike, the failure said once."""
    from launch import run_python

    Trainer(tiny_config(tiny_run, "train.steps=3", "train.checkpoint_every=3")).fit()
    (tiny_run / "eval.json").mkdir()
    with pytest.raises(RuntimeError) as failed:
        run_python(["-m", "kiln", "eval", str(tiny_run)], world_size=2, timeout=120)
    said = str(failed.value)
    assert "rank 0 exited 1:" in said and "rank 1 exited 1:" in said, said
    assert said.count("eval.json") >= 1 and said.count("kiln: ") == 1, said
