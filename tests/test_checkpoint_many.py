"""A run kept for days holds hundreds of checkpoint folders, past step 99,999,999 a name one
digit longer: they are ordered, pruned and named by their step, never as text."""

from __future__ import annotations

from kiln.train import checkpoint as ckpt_mod
from kiln.train.checkpoint_dirs import complete_checkpoints, latest_checkpoint

STEPS = [*range(1000, 300_001, 1000), 99_999_000, 100_000_000, 100_001_000]


def _folders(root, steps=STEPS):
    for step in steps:
        folder = root / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "trainer.pt").write_bytes(b"x")


def test_an_unreadable_checkpoint_names_the_one_before_it_by_step(tmp_path):
    _folders(tmp_path)
    error = ckpt_mod.unreadable(tmp_path / "step_100000000", ValueError("damaged"))
    assert "the previous one, step_99999000" in str(error)


def test_hundreds_of_checkpoints_prune_to_the_newest(tmp_path):
    _folders(tmp_path)
    assert latest_checkpoint(tmp_path).name == "step_100001000"
    ckpt_mod._prune(tmp_path, 3, tmp_path / "step_100001000")
    assert [p.name for p in complete_checkpoints(tmp_path)] == [
        "step_99999000", "step_100000000", "step_100001000"]
    ckpt_mod._prune(tmp_path, 0, tmp_path / "step_100001000")  # 0 keeps them all
    assert len(complete_checkpoints(tmp_path)) == 3
