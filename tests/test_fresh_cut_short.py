"""`kiln train --fresh` killed while it moved the earlier model's outputs to archive/: the
next command, `--fresh` again or a plain `kiln train`, finishes that archive folder (one
folder for one fresh start) and trains from step 0, with no hand needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_config
from kill_points import kiln_killed_at
from test_train import train_losses

from kiln.train.checkpoint_dirs import checkpoint_step, latest_checkpoint
from kiln.train.trainer import Trainer

STEPS = ("train.steps=3", "train.checkpoint_every=3")
# the earlier model's outputs, and copies of the records of what it was
ARCHIVED = ["checkpoints", "config.toml", "env.json", "metrics.jsonl", "model.json"]


def _trained_then_fresh_killed(run: Path) -> None:
    """A run trained to step 3, then `kiln train --fresh` killed after it moved the
    checkpoints to archive/ and before it moved metrics.jsonl."""
    train_losses(run, *STEPS)
    kiln_killed_at("os:replace", "train", str(run), "--fresh", matching="metrics.jsonl")
    assert not (run / "checkpoints").exists() and (run / "metrics.jsonl").is_file()


def _one_archive(run: Path) -> list[str]:
    (folder,) = (run / "archive").iterdir()
    assert folder.name.startswith("before-fresh-")
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("again", ["--fresh", "plain"])
def test_a_fresh_start_killed_between_two_moves_is_finished_by_the_next_command(
        tiny_run, again, capsys):
    _trained_then_fresh_killed(tiny_run)
    trainer = Trainer(tiny_config(tiny_run, *STEPS),
                      resume=again == "plain")
    assert len(trainer.fit()) == 3  # from step 0
    assert _one_archive(tiny_run) == ARCHIVED
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 3
    if again == "plain":
        assert "cut short" in capsys.readouterr().err


def test_a_fresh_start_killed_before_its_first_move_leaves_no_empty_folder(tiny_run):
    """Killed as it moved its first output (the archive folder made, nothing in it yet),
    a fresh start left an empty archive folder beside the one the next start made."""
    train_losses(tiny_run, *STEPS)
    kiln_killed_at("os:replace", "train", str(tiny_run), "--fresh", matching="checkpoints")
    assert (tiny_run / "checkpoints").is_dir()

    trainer = Trainer(tiny_config(tiny_run, *STEPS), resume=False)
    assert len(trainer.fit()) == 3
    assert _one_archive(tiny_run) == ARCHIVED


def test_an_empty_archive_folder_a_kill_left_goes_at_the_next_fresh_start(tiny_run):
    """A kill just after the archive folder was made, before its in-progress mark: an empty
    folder, which holds nothing, goes; the outputs move to one folder."""
    train_losses(tiny_run, *STEPS)
    (tiny_run / "archive" / "before-fresh-20200101-000000").mkdir(parents=True)
    Trainer(tiny_config(tiny_run, *STEPS), resume=False).fit()
    assert _one_archive(tiny_run) == ARCHIVED


def test_kiln_run_after_a_fresh_start_cut_short_takes_the_new_design(tiny_run):
    """A fresh start (for another model design) killed before it moved the checkpoints:
    the plain `kiln run` that goes on with it must not refuse that design as a change to
    the trained model the start had set aside."""
    from kiln.commands.early_refusals import refuse_new_model_design
    from kiln.errors import KilnError

    train_losses(tiny_run, *STEPS)
    cfg = tiny_config(tiny_run, *STEPS, "model.dim=96")
    with pytest.raises(KilnError, match="model.dim"):  # a plain resume: refused
        refuse_new_model_design(cfg)
    begun = tiny_run / "archive" / "before-fresh-20200101-000000"
    begun.mkdir(parents=True)
    (begun / ".unfinished").touch()  # as `--fresh` leaves it, killed before its first move
    refuse_new_model_design(cfg)


def test_the_archive_keeps_the_config_that_builds_its_model(tiny_run):
    """`--fresh` with a new model.dim: the archived checkpoints were of a model no record
    described any more (config.toml, model.json and env.json were rewritten for the new
    one); copies of the earlier ones go with them, the run keeps its own."""
    from kiln.config import recorded_config
    from kiln.train.train_setup import model_config_for_run
    from kiln.train.trained_run import loaded_model

    train_losses(tiny_run, *STEPS)
    Trainer(tiny_config(tiny_run, *STEPS, "model.dim=96"), resume=False).fit()
    (folder,) = (tiny_run / "archive").iterdir()
    assert recorded_config(folder).model.dim == 64 and recorded_config(tiny_run).model.dim == 96
    assert '"params"' in (folder / "model.json").read_text()
    old = recorded_config(folder)
    model = loaded_model(model_config_for_run(old, tiny_run / "tokens"),
                         latest_checkpoint(folder / "checkpoints"))
    assert model.cfg.dim == 64


def test_a_restart_archives_the_config_of_the_model_it_sets_aside(tmp_path):
    """A run killed before its first checkpoint, run again (`kiln run`) with a new
    model.dim: the data stages recorded the new config.toml (no checkpoint keeps the old
    one) before the trainer's restart archived the earlier model's metrics, and the archive
    took that new config beside the old model's metrics and model.json."""
    from kiln.commands.data_stages import record_config
    from kiln.config import recorded_config
    from kiln.run_dir import write_run_metadata
    from kiln.train.checkpoint import archive_checkpoints
    from kiln.train.earlier_outputs import EARLIER_RECORDS

    run = tmp_path / "run"
    write_run_metadata(tiny_config(run))  # the earlier model's, as its trainer recorded
    (run / "model.json").write_text('{"params": 1}\n')
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # killed before step 3
    new = tiny_config(run, "model.dim=96")
    record_config(new)  # kiln run's data stages, before its trainer
    record_config(new)  # (and again: the first kept copy is the earlier model's)
    assert recorded_config(run).model.dim == 96
    folder = archive_checkpoints(run, "restart")  # the trainer's restart
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.toml", "env.json", "metrics.jsonl", "model.json"]
    assert recorded_config(folder).model.dim == 64 and recorded_config(run).model.dim == 96
    assert not (run / EARLIER_RECORDS).exists()
    # nothing to archive (a plain new run): the data verbs keep no copies
    record_config(new)
    assert not (run / EARLIER_RECORDS).exists()
