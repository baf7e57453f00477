"""An export killed between its two renames (the previous export moved aside to
`.export.old-PID`, the new one not yet in place) left no export/ until the next export:
every reader of export/ now puts the previous one back, and nothing is ever deleted."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import tiny_config

from kiln.export_recovery import is_whole_export, recover_export, stranded_exports


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


# A real kill: SIGKILL at one point of the swap, so no `finally` clears the new copy (raising
# an exception in-process would, and would simulate a state no kill leaves).
_KILLED_EXPORT = """
import os, shutil, signal, sys
import kiln.atomic as atomic
from kiln.cli import main

point = sys.argv[2]
real_replace, real_rmtree = os.replace, shutil.rmtree

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def replace(src, dst, *a, **k):
    name = os.path.basename(src)
    if (point == "before-first-rename" and name == "export"
            or point == "between-renames" and name.startswith(".export.tmp-")):
        die()
    return real_replace(src, dst, *a, **k)

def rmtree(path, *a, **k):
    if point == "before-clearing-the-previous" and os.path.basename(path).startswith(".export.old-"):
        die()
    return real_rmtree(path, *a, **k)

def save_tensors(*a, **k):
    die()

real_sync = atomic.fsync_dir

def fsync_dir(path):
    if point == "after-the-swap" and os.path.basename(path) == os.path.basename(sys.argv[1]):
        die()
    return real_sync(path)

atomic.os.replace, atomic.shutil.rmtree, atomic.fsync_dir = replace, rmtree, fsync_dir
if point == "while-writing":
    import kiln.export.hf_folder as hf_folder
    hf_folder.save_tensors = save_tensors
main(["export", sys.argv[1]])
"""


def _export_killed_at(run, point: str) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _KILLED_EXPORT, str(run), point],
                          capture_output=True, text=True, env=os.environ)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _checkpoint_of(export) -> str:
    import json

    return json.loads((export / "kiln_export.json").read_text())["checkpoint"]


@pytest.mark.parametrize("point, kept", [
    ("while-writing", "previous"),  # the new copy is half-written
    ("before-first-rename", "previous"),  # complete, maybe: nothing proves it, nothing lost
    ("between-renames", "new"),  # complete: the previous one was moved aside only after
    ("before-clearing-the-previous", "new"),
])
def test_an_export_killed_at_each_point_of_its_swap(tiny_run, capsys, point, kept):
    """An export killed between its two renames had written and synced the whole new
    export: it was deleted and the previous one put back, as if the export had never run."""
    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    export = tiny_run / "export"
    assert main(["export", str(tiny_run)]) == 0
    new = _checkpoint_of(export)
    record = json.loads((export / "kiln_export.json").read_text())
    (export / "kiln_export.json").write_text(json.dumps({**record, "checkpoint": "previous"}))
    _export_killed_at(tiny_run, point)
    capsys.readouterr()
    assert main(["report", str(tiny_run)]) == 0
    assert _checkpoint_of(export) == {"previous": "previous", "new": new}[kept]
    assert is_whole_export(export) and not stranded_exports(export)
    if point == "between-renames":
        assert "had finished the new export" in capsys.readouterr().err
    assert main(["export", str(tiny_run)]) == 0  # and the next export leaves nothing beside
    assert sorted(p.name for p in tiny_run.iterdir() if p.name.startswith(".export")) == []
    assert not (tiny_run / "archive").exists()


def test_a_first_export_killed_before_its_rename_leaves_no_export(tiny_run):
    """Nothing proves a lone `.tmp-PID` complete: it is cleared, never taken for an export."""
    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    _export_killed_at(tiny_run, "between-renames")
    assert main(["report", str(tiny_run)]) == 0
    assert not (tiny_run / "export").exists()
    assert main(["export", str(tiny_run)]) == 0
    assert sorted(p.name for p in tiny_run.iterdir() if p.name.startswith(".export")) == []


def test_a_finished_copy_needs_an_exports_files(tmp_path):
    """A `.tmp-PID` beside the `.old-PID` of the same dead writer that lacks an export's files
    (not written by `atomic_dir`) is not taken for the new export."""
    run = tmp_path / "run"
    pid = os.getpid()  # our own pid: a killed predecessor's
    for kind, files in (("old", ("config.json", "model.safetensors", "kiln_export.json")),
                        ("tmp", ("config.json", "model.safetensors"))):
        folder = run / f".export.{kind}-{pid}"
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_text(json.dumps({"format": kind}))
    assert "it is back in" in recover_export(run / "export", run)
    assert json.loads((run / "export/kiln_export.json").read_text()) == {"format": "old"}
    assert sorted(p.name for p in run.iterdir()) == ["export"]


def test_loading_a_model_outside_a_run_moves_nothing(tmp_path):
    """`load_native(path)` put a killed export's leftovers back beside any folder, moving
    what was at `path` to `<parent>/archive/`, in a folder that need not be a Kiln run."""
    from kiln.export import load_native

    models = tmp_path / "models"
    old = models / f".mine.old-{os.getpid()}"  # a dead writer's (copied along, say)
    old.mkdir(parents=True)
    for name in ("config.toml", "model.safetensors", "kiln_export.json"):
        (old / name).write_text("x")
    (models / "mine").mkdir()
    (models / "mine/README.md").write_text("my notes")

    def tree() -> list[str]:
        return sorted(str(p.relative_to(models)) for p in models.rglob("*"))

    before = tree()
    with pytest.warns(UserWarning, match=r"mine is not a whole export: .* nothing was moved"), \
            pytest.raises(FileNotFoundError, match="is not a Kiln native export"):
        load_native(models / "mine")
    assert tree() == before
    shutil.rmtree(models / "mine")
    before = tree()
    with pytest.warns(UserWarning, match="mine is missing: .* left the previous export in"), \
            pytest.raises(FileNotFoundError):
        load_native(models / "mine")
    assert tree() == before


@pytest.mark.parametrize("point, put_back", [
    ("while-writing", True), ("between-renames", True), ("after-the-swap", False)])
def test_a_model_card_set_aside_by_a_killed_export(tiny_run, capsys, point, put_back):
    """export/ holding a model card moves to the archive before the export and comes back
    if it fails; killed, it stayed there in silence and the run had no export/ at all."""
    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    export = tiny_run / "export"
    assert main(["export", str(tiny_run)]) == 0
    (export / "README.md").write_text("my model card")
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    _export_killed_at(tiny_run, point)
    capsys.readouterr()
    assert main(["report", str(tiny_run)]) == 0
    err = capsys.readouterr().err
    if put_back:
        assert {p.name: p.read_bytes() for p in export.iterdir()} == before
        assert f"it is back in {export}" in err and not (tiny_run / "archive").exists()
    else:
        assert is_whole_export(export) and not (export / "README.md").exists()
        [kept] = tiny_run.glob("archive/before-export-*/export")
        assert (kept / "README.md").read_text() == "my model card"
        assert f"held that an export does not write to {kept}" in err
    assert not list(tiny_run.glob(".export.set-aside-*"))
