"""Run-folder writes cut short: a kill while pruning, a disk that cannot take archive/."""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import pytest
from conftest import tiny_config
from test_train import train_losses

from kiln.errors import CheckpointError
from kiln.train import checkpoint as ckpt_mod
from kiln.train.checkpoint_dirs import checkpoint_step, complete_checkpoints, latest_checkpoint
from kiln.train.trainer import Trainer


def test_a_kill_while_pruning_leaves_no_half_deleted_checkpoint(tiny_run, monkeypatch):
    """keep_checkpoints prunes step 3 when step 9 is saved; the run is killed with step 3's
    deletion half done (trainer.pt still there): that folder must not count as a complete
    checkpoint (a resume, the divergence advice or the next pruning would trust it), and
    the next save clears what is left of it."""
    real_rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        path = Path(path)
        pruned = path.name == "step_00000003" or path.name.startswith(".step_00000003.trash")
        if pruned:  # the weights gone, trainer.pt not yet
            (path / "model.safetensors").unlink()
            (path / "optimizer.pt").unlink()
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", killed_midway)
    keep = ("train.checkpoint_every=3", "train.keep_checkpoints=2")
    with pytest.raises(KeyboardInterrupt):
        train_losses(tiny_run, "train.steps=9", *keep)
    monkeypatch.undo()
    ckpts = tiny_run / "checkpoints"
    assert [p.name for p in complete_checkpoints(ckpts)] == ["step_00000006", "step_00000009"]
    assert not (ckpts / "step_00000003").exists()

    _, resumed = train_losses(tiny_run, "train.steps=12", *keep)
    assert len(resumed) == 3 and checkpoint_step(latest_checkpoint(ckpts)) == 12
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000009", "step_00000012"]


def test_fresh_on_a_disk_that_cannot_take_archive_is_one_line(tiny_run, monkeypatch):
    """`kiln train --fresh` moves the old outputs to archive/ first: a full disk there is
    the one-line error a checkpoint write gives (a CheckpointError), not a raw OSError, and
    the old model's checkpoints stay where they were."""
    train_losses(tiny_run, "train.steps=3", "train.checkpoint_every=3")

    def full(run_dir, label):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "archive"))

    monkeypatch.setattr(ckpt_mod, "new_archive_folder", full)
    with pytest.raises(CheckpointError, match=r"cannot move the earlier model's outputs to .*"
                       r"archive .*No space left on device.*nothing was trained.*"
                       r"`kiln train --fresh` again"):
        Trainer(tiny_config(tiny_run, "train.steps=3"), resume=False).fit()
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 3
    assert not (tiny_run / "archive").exists()


def test_a_restart_archives_no_half_written_checkpoint(tiny_run):
    """A run killed while its first checkpoint was written (its weights on disk, the rest
    not) restarts at step 0 with its records archived: the half-written folder it left is
    garbage (as large as a checkpoint), cleared, not carried into archive/ to stay forever."""
    from kill_points import kiln_killed_at

    kiln_killed_at("kiln.train.checkpoint:file_sha256", "train", str(tiny_run),
                   "--set", "train.steps=3", "--set", "train.checkpoint_every=3")
    ckpts = tiny_run / "checkpoints"
    assert [p.name for p in ckpts.glob(".step_00000003.tmp-*")]  # what the kill left
    assert (tiny_run / "metrics.jsonl").stat().st_size > 0

    _, losses = train_losses(tiny_run, "train.steps=3", "train.checkpoint_every=3")
    assert len(losses) == 3
    (archived,) = (tiny_run / "archive").iterdir()
    left = sorted(str(p.relative_to(archived)) for p in archived.rglob("*"))
    assert left == ["config.toml", "env.json", "metrics.jsonl", "model.json"]  # + its records
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000003"]


def test_a_kill_while_pruning_after_the_last_step_leaves_no_hidden_checkpoint(tiny_run):
    """Killed while deleting the checkpoint its last save pruned, a run left a hidden
    `.step_N.trash-PID` (a checkpoint's size) that only a later save clears: the re-run
    that finds nothing left to train clears it."""
    from kill_points import kiln_killed_at

    keep = ("--set", "train.steps=6", "--set", "train.checkpoint_every=3",
            "--set", "train.keep_checkpoints=1")
    kiln_killed_at("shutil:rmtree", "train", str(tiny_run), *keep, matching=".trash-")
    ckpts = tiny_run / "checkpoints"
    assert [p.name for p in ckpts.glob(".step_00000003.trash-*")]  # what the kill left

    _, losses = train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3",
                             "train.keep_checkpoints=1")
    assert losses == []
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000006"]


def test_a_kill_before_the_last_saves_pruning_leaves_no_extra_checkpoint(tiny_run):
    """Killed after its last save's `latest` pointer, before that save pruned (step 3 with
    keep_checkpoints = 1), a run kept one checkpoint more than its settings, and no later
    save came to prune it: the re-run with nothing left to train prunes it."""
    from kill_points import kiln_killed_at

    keep = ("--set", "train.steps=6", "--set", "train.checkpoint_every=3",
            "--set", "train.keep_checkpoints=1")
    kiln_killed_at("os:replace", "train", str(tiny_run), *keep, matching=".trash-")
    ckpts = tiny_run / "checkpoints"
    assert [p.name for p in complete_checkpoints(ckpts)] == ["step_00000003", "step_00000006"]

    _, losses = train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3",
                             "train.keep_checkpoints=1")
    assert losses == []
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000006"]


def test_a_resumed_run_is_pruned_to_its_settings_before_it_trains(tiny_run):
    """A resume prunes at its start, around the checkpoint it loaded (never newer ones, nor
    that one): the kept set matches keep_checkpoints before the first step, not only after
    the next save (which a run killed again before it never reaches)."""
    from test_train import stopped_after

    every = ("train.checkpoint_every=3",)
    with pytest.raises(KeyboardInterrupt):
        train_losses(tiny_run, "train.steps=12", *every, "train.keep_checkpoints=0",
                     callbacks=stopped_after(9))
    ckpts = tiny_run / "checkpoints"
    (ckpts / "latest").write_text("step_00000006\n")  # as a kill before step 9's pointer
    with pytest.raises(KeyboardInterrupt):  # stopped before its first step
        train_losses(tiny_run, "train.steps=12", *every, "train.keep_checkpoints=1",
                     callbacks=stopped_after(7))
    assert [p.name for p in complete_checkpoints(ckpts)] == ["step_00000006", "step_00000009"]


class _FillingDisk:
    """A file opened for writing on a disk with `room` bytes left: a write past it fails
    as the OS fails it (ENOSPC), with what fitted already written."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= n
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.mark.parametrize("name", ["optimizer.pt", "trainer.pt"])
def test_a_disk_filling_during_a_torch_file_says_so_and_keeps_the_last_checkpoint(
        tiny_run, monkeypatch, name):
    """torch.save's zip writer swallows its file's error and fails later on its own check
    ("[enforce fail at inline_container.cc] unexpected pos 704 vs 598"): the error must
    name the full disk, as one from the safetensors file does, and the checkpoint kept;
    no half-written folder stays, and the run resumes from that checkpoint."""
    import builtins

    import kiln.hashing

    trainer, _ = train_losses(tiny_run, "train.steps=6")
    real_open = builtins.open

    def disk_filling(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return _FillingDisk(f, 600) if Path(path).name == name and "w" in mode else f

    monkeypatch.setattr(kiln.hashing, "open", disk_filling, raising=False)
    trainer.step = 9
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*step_00000009 "
                       r"\(OSError: \[Errno 28\] No space left on device\).*the last "
                       r"checkpoint, step_00000006, is intact") as e:
        ckpt_mod.save_checkpoint(tiny_run / "checkpoints", 9, trainer.model, trainer.optimizer,
                                 trainer.state_dict(), trainer.env)
    assert "enforce fail" not in str(e.value)
    monkeypatch.undo()
    ckpts = tiny_run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000006"]
    assert Trainer(tiny_config(tiny_run, "train.steps=6")).step == 6


def test_a_disk_without_room_for_the_next_checkpoint_is_said_before_that_save(tiny_run,
                                                                             monkeypatch, capsys):
    """Each save writes a whole checkpoint before the oldest is pruned: a disk with less free
    than one checkpoint fails the next save, checkpoint_every steps on, and those steps are
    lost. Said once, after the save that leaves the disk so, and by a resume onto such a disk
    before it trains, with what to do."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3")
    err = capsys.readouterr().err
    said = re.findall(r"note: (\S+) has 1\.0 kB free, less than one checkpoint \(([\d.]+ [kM]B), "
                      r"as (step_\d+)\): the next save will fail; free space", err)
    assert [(Path(root), ckpt) for root, _, ckpt in said] == [
        (tiny_run / "checkpoints", "step_00000003")]
    Trainer(tiny_config(tiny_run, "train.steps=9", "train.checkpoint_every=3")).fit()
    err = capsys.readouterr().err
    # at the start, before step 7; not again after step 9's save, the run's last
    assert len(re.findall("less than one checkpoint", err)) == 1
    assert err.index("less than one checkpoint") < err.index("step 9: val loss")


def test_the_disk_room_note_is_not_said_after_the_last_save_of_a_run(tiny_run, monkeypatch,
                                                                     capsys):
    """After the run's last save there is no next save for the note to warn of (a resume
    with more steps says it before it trains): it said "the next save will fail" as the run
    ended, and again after a resume's last save where the resume had said it already."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    train_losses(tiny_run, "train.steps=3", "train.checkpoint_every=3")
    assert (tiny_run / "checkpoints" / "step_00000003" / "trainer.pt").is_file()
    assert "less than one checkpoint" not in capsys.readouterr().err
