"""An export killed between its two renames (the previous export moved aside to
`.export.old-PID`, the new one not yet in place) left no export/ until the next export:
every reader of export/ now puts the previous one back, and nothing is ever deleted."""

from __future__ import annotations

import os

import pytest
from conftest import tiny_config

from kiln.export_recovery import recover_export, stranded_exports


class Killed(BaseException):
    """A kill: not an error `atomic_dir` handles (it would put the old export back)."""


@pytest.fixture
def killed_between_renames(monkeypatch):
    """Make the next swap of a folder named `name` into place die after its first rename."""
    real = os.replace

    def arm(name: str):
        def replace(src, dst, *a, **k):
            if os.path.basename(src).startswith(f".{name}.tmp-"):
                raise Killed
            return real(src, dst, *a, **k)
        monkeypatch.setattr(os, "replace", replace)
    yield arm
    monkeypatch.setattr(os, "replace", real)


def _kill_an_export(run, arm, monkeypatch) -> None:
    from kiln.cli import main

    assert main(["export", str(run)]) == 0
    arm("export")
    with pytest.raises(Killed):
        main(["export", str(run)])
    monkeypatch.undo()
    assert not (run / "export").exists() and len(stranded_exports(run / "export")) == 1


def test_report_and_export_put_a_killed_exports_previous_one_back(
        tiny_run, killed_between_renames, monkeypatch, capsys):
    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    _kill_an_export(tiny_run, killed_between_renames, monkeypatch)
    capsys.readouterr()
    assert main(["report", str(tiny_run)]) == 0
    err = capsys.readouterr().err
    assert f"{tiny_run / 'export'} was missing: an export killed while replacing it" in err
    assert (tiny_run / "export/kiln_export.json").is_file()
    assert not stranded_exports(tiny_run / "export")
    assert "hf-llama" in (tiny_run / "report.html").read_text()

    _kill_an_export(tiny_run, killed_between_renames, monkeypatch)
    capsys.readouterr()
    assert main(["export", str(tiny_run)]) == 0
    assert "note: " in capsys.readouterr().err
    assert (tiny_run / "export/model.safetensors").is_file()
    assert not stranded_exports(tiny_run / "export") and not (tiny_run / "archive").exists()


def test_a_folder_made_in_place_of_the_missing_export_is_archived_not_deleted(tmp_path):
    run = tmp_path / "run"
    old = run / f".export.old-{os.getpid()}"  # our own pid: a killed predecessor's
    old.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "kiln_export.json"):
        (old / name).write_text(name)
    (run / "export").mkdir()
    (run / "export/notes.txt").write_text("mine")
    note = recover_export(run / "export", run)
    assert "it is back in" in note and "notes.txt" not in note
    assert (run / "export/model.safetensors").read_text() == "model.safetensors"
    [kept] = run.glob("archive/before-export-recovery-*/export")
    assert (kept / "notes.txt").read_text() == "mine"
    assert recover_export(run / "export", run) is None  # nothing stranded any more


def test_an_export_still_being_replaced_is_left_to_its_writer(tmp_path):
    run = tmp_path / "run"
    (run / ".export.old-1").mkdir(parents=True)  # pid 1 is alive: that export is running
    assert "being replaced by a running export (process 1)" in recover_export(run / "export", run)
    assert (run / ".export.old-1").is_dir() and not (run / "export").exists()


def test_load_native_and_the_archive_find_a_killed_exports_previous_one(
        tiny_run, killed_between_renames, monkeypatch):
    import torch

    from kiln.cli import cmd_train
    from kiln.export import export_native, load_native
    from kiln.train.checkpoint import archive_checkpoints
    from kiln.train.trained_run import load_trained_model

    cfg = tiny_config(tiny_run, "train.steps=6")
    cmd_train(cfg)
    model, _ = load_trained_model(cfg)
    tok = tiny_run / "tokenizer/tokenizer.json"
    out = tiny_run / "export"
    export_native(model, tok, out, cfg, "test")
    killed_between_renames("export")
    with pytest.raises(Killed):
        export_native(model, tok, out, cfg, "test")
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="was missing: an export killed"):
        back = load_native(out)
    assert torch.equal(back.embed.weight, model.embed.weight.cpu())

    killed_between_renames("export")
    with pytest.raises(Killed):
        export_native(model, tok, out, cfg, "test")
    monkeypatch.undo()
    dest = archive_checkpoints(tiny_run)  # `train --fresh`: the previous export goes with it
    assert (dest / "export/model.safetensors").is_file() and not stranded_exports(out)


def test_a_stranded_export_counts_as_a_trained_models_output(tiny_run):
    """Checkpoints deleted after export, then an export killed mid-swap: training again must
    not start over (archiving the model's outputs) because export/ alone looked missing."""
    import shutil

    from kiln.cli import cmd_train
    from kiln.errors import CheckpointError

    cfg = tiny_config(tiny_run, "train.steps=6")
    cmd_train(cfg)
    shutil.rmtree(tiny_run / "checkpoints")
    old = tiny_run / f".export.old-{os.getpid()}"
    old.mkdir()
    (old / "model.safetensors").write_text("weights")
    with pytest.raises(CheckpointError, match=r"outputs \(export \(moved aside by an export"):
        cmd_train(cfg)
    assert (old / "model.safetensors").is_file() and not (tiny_run / "archive").exists()
