"""Starting and resuming `kiln train` at the edges: a full disk before step 1, a damaged
`latest` pointer, settings changed on resume that move the validation curve."""

from __future__ import annotations

import pytest
from conftest import as_before_checksums, tiny_config

from kiln.errors import CheckpointError
from kiln.train.trainer import Trainer


def test_a_full_disk_when_the_run_records_its_settings_is_one_clear_error(tiny_run, monkeypatch):
    """config.toml, env.json and model.json are written before step 1: a full disk there is
    the checkpoint writers' one-line error naming the checkpoint kept, not a traceback."""
    import kiln.run_dir as run_dir_module

    Trainer(tiny_config(tiny_run, "train.steps=6")).fit()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_dir_module, "write_text_atomic", full)
    trainer = Trainer(tiny_config(tiny_run, "train.steps=12"))
    with pytest.raises(CheckpointError, match=r"cannot write the run's config.toml.*No space left"
                       r".*the last checkpoint, step_00000006, is intact"):
        trainer.fit()
    assert trainer.step == 6  # nothing trained past the checkpoint


@pytest.mark.parametrize("damage", ["bytes that are not text", "a folder", "a path elsewhere"])
def test_a_damaged_latest_pointer_resumes_from_the_newest_checkpoint(tiny_run, damage):
    """`latest` is written atomically, but a disk can still damage it: the newest complete
    checkpoint stands in (as for a pointer naming one gone), not a UnicodeDecodeError or
    IsADirectoryError traceback; with no checkpoint left the refusal says it is damaged."""
    import shutil

    Trainer(tiny_config(tiny_run, "train.steps=12")).fit()  # checkpoints at 6 and 12
    pointer = tiny_run / "checkpoints" / "latest"
    pointer.unlink()
    if damage == "bytes that are not text":
        pointer.write_bytes(b"\xff\xfe\x00step")
    elif damage == "a folder":
        pointer.mkdir()
    else:  # a checkpoint of another run, by a relative path out of this run's checkpoints/
        other = tiny_run.parent / "other" / "step_00000003"
        shutil.copytree(tiny_run / "checkpoints" / "step_00000006", other)
        pointer.write_text("../../other/step_00000003\n")
    trainer = Trainer(tiny_config(tiny_run, "train.steps=12"))
    assert trainer.step == 12 and trainer._resumed_from.name == "step_00000012"
    shutil.rmtree(tiny_run / "checkpoints" / "step_00000006")
    shutil.rmtree(tiny_run / "checkpoints" / "step_00000012")
    with pytest.raises(CheckpointError, match=r"latest (is damaged|names '[^']*'), but no "
                       "complete checkpoint is left"):
        Trainer(tiny_config(tiny_run, "train.steps=12"))


def test_resume_with_another_eval_batch_size_says_the_val_curve_moves(tiny_run, capsys):
    """Validation measures train.eval_batches batches of eval.batch_size windows: resumed
    with another eval.batch_size, the curve goes on over other windows, which is said like
    another train.eval_batches is, not left to look like a change in the model."""
    from kiln.eval.perplexity import evaluate

    trainer = Trainer(tiny_config(tiny_run, "train.steps=6"))
    trainer.fit()
    cfg = trainer.cfg
    measured = [evaluate(trainer.model, trainer.token_dir, "val", cfg.train.seq_len, size,
                         cfg.train.eval_batches, trainer.device, trainer.precision,
                         trainer.env)["loss"] for size in (cfg.eval.batch_size, 4)]
    assert measured[0] != measured[1]  # the same weights, another curve
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, "train.steps=6", "eval.batch_size=4"))
    assert "eval.batch_size: 16 -> 4 (validation measures other windows" in capsys.readouterr().err


def test_a_full_disk_for_the_latest_pointer_resumes_from_the_checkpoint_just_written(tiny_run,
                                                                                    monkeypatch):
    """The checkpoint can take the disk's last bytes and the small `latest` write after it
    then fail: the checkpoint is complete on disk, so the next run resumes from it, not from
    the older one the stale pointer named (its steps trained again)."""
    from kiln.train import checkpoint as ckpt_mod

    trainer = Trainer(tiny_config(tiny_run, "train.steps=6"))
    trainer.fit()

    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt_mod, "write_text_atomic", full)
    trainer.step = 9
    with pytest.raises(CheckpointError, match=r"cannot write \S*latest .*No space left.*the last "
                       "checkpoint, step_00000009, is intact"):
        ckpt_mod.save_checkpoint(tiny_run / "checkpoints", 9, trainer.model, trainer.optimizer,
                                 trainer.state_dict(), trainer.env)
    monkeypatch.undo()
    assert Trainer(tiny_config(tiny_run, "train.steps=12")).step == 9


@pytest.mark.parametrize("edit", ["trainer.pt removed", "moved aside"])
def test_a_latest_checkpoint_not_resumable_is_named_when_an_older_one_stands_in(tiny_run, capsys,
                                                                               edit):
    """`latest` names step 12, but a file of it was removed by hand (trainer.pt: it no longer
    counts as complete) or it was moved aside (the way on the unreadable-checkpoint error
    gives): the run resumes from step 6, and says which checkpoint it passed over and why,
    where it said only "resumed from step_00000006" and six trained steps went unmentioned."""
    Trainer(tiny_config(tiny_run, "train.steps=12")).fit()  # checkpoints at 6 and 12
    newest = tiny_run / "checkpoints" / "step_00000012"
    if edit == "trainer.pt removed":
        (newest / "trainer.pt").unlink()
        why = "not a complete checkpoint (no trainer.pt)"
    else:
        newest.rename(newest.with_name("step_00000012.bad"))
        why = "gone"
    capsys.readouterr()
    trainer = Trainer(tiny_config(tiny_run, "train.steps=12"))
    assert trainer.step == 6
    err = capsys.readouterr().err
    assert f"note: checkpoints/latest names step_00000012, which is {why}: resumed from " \
           "step_00000006, the newest complete one" in err


def test_a_damaged_checkpoint_file_is_named_in_the_refusal(tiny_run):
    """A file damaged where its sum cannot tell (a checkpoint from before checksums.json),
    or checksums.json itself damaged: the refusal names the file, where it gave torch's or
    safetensors' text alone ("PytorchStreamReader failed reading zip archive", "invalid
    header length", "KeyError: 'optimizer.pt'"), none of which says which file it was."""
    import json
    import re
    import shutil

    from kiln.train.checkpoint import CHECKSUMS

    Trainer(tiny_config(tiny_run, "train.steps=6", "train.checkpoint_every=3")).fit()
    ckpt = tiny_run / "checkpoints" / "step_00000006"
    kept = tiny_run.parent / "kept"
    shutil.copytree(ckpt, kept)

    def sums_without_optimizer() -> None:
        sums = json.loads((ckpt / CHECKSUMS).read_text())
        del sums["optimizer.pt"]
        (ckpt / CHECKSUMS).write_text(json.dumps(sums))

    damages = {
        "model.safetensors": lambda: (ckpt / "model.safetensors").write_bytes(b"\x00" * 9),
        "optimizer.pt": lambda: (ckpt / "optimizer.pt").write_bytes(b"PK\x03\x04"),
        "trainer.pt": lambda: (ckpt / "trainer.pt").write_bytes(b"PK\x03\x04"),
    }
    for name, damage in [*((n, d) for n, d in damages.items()),
                         (CHECKSUMS, lambda: (ckpt / CHECKSUMS).write_text('{"model.s')),
                         (CHECKSUMS, sums_without_optimizer),
                         (CHECKSUMS, lambda: (ckpt / CHECKSUMS).write_text("[1, 2]"))]:
        if name != CHECKSUMS:  # from before checksums: nothing else names the file
            as_before_checksums(ckpt)
        damage()
        with pytest.raises(CheckpointError) as e:
            Trainer(tiny_config(tiny_run, "train.steps=9", "train.checkpoint_every=3"))
        assert re.search(rf"step_00000006 is unreadable \(\w+: {re.escape(name)}[: ]",
                         str(e.value)), (name, str(e.value))
        assert "previous one, step_00000003" in str(e.value)
        shutil.rmtree(ckpt)
        shutil.copytree(kept, ckpt)


@pytest.mark.parametrize("part", ["rng", "loader", "callbacks"])
def test_an_altered_part_of_trainer_pt_is_named_in_the_refusal(tiny_run, part):
    """trainer.pt's RNG state, loader position and callbacks' states are refused, as its
    other parts are, naming trainer.pt: their errors were torch's or Python's own
    ('KeyError: 'loss'', 'RuntimeError: Invalid mt19937 state'), which name no file."""
    import torch
    from conftest import as_written

    Trainer(tiny_config(tiny_run, "train.steps=6", "train.checkpoint_every=3")).fit()
    path = tiny_run / "checkpoints" / "step_00000006" / "trainer.pt"
    state = torch.load(path, weights_only=True)
    if part == "rng":
        state["rng"] = torch.zeros(3, dtype=torch.uint8)
    elif part == "loader":
        state["loader"] = {"bogus": 1}
    else:
        assert state["callbacks"]
        state["callbacks"] = {name: {"bogus": 1} for name in state["callbacks"]}
    torch.save(state, path)
    as_written(path.parent)
    with pytest.raises(CheckpointError, match=r"step_00000006 is unreadable \(\w+: "
                       r"trainer\.pt: .*previous one, step_00000003"):
        Trainer(tiny_config(tiny_run, "train.steps=9")).fit()
