"""A prepare killed while it clears or archives the earlier prepare's outputs: the same
command again finishes the job, and the earlier documents are never lost (kills are
simulated by an exception at the point, as nothing there cleans up)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kiln.data import prepare_outputs
from kiln.data.documents import read_documents
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.yield_report import LAYOUT_FILE

READ_WRITE = PrepareConfig(stages=["read", "write"])


class Killed(BaseException):
    """The process ends here: nothing after this point runs."""


def _source(tmp_path: Path, name: str, texts: list[str]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"{i}.txt").write_text(text)
    return str(folder)


def _texts(run: Path) -> list[str]:
    return sorted(d.text for d in read_documents(run))


@pytest.mark.parametrize("killed_moving", ["prepare", "documents", "prepare.json"])
@pytest.mark.parametrize("again_with", ["other", "same"])
def test_a_kill_while_archiving_the_earlier_documents_loses_none(tmp_path, monkeypatch,
                                                                 killed_moving, again_with):
    """A prepare with another source moves the finished earlier prepare (its documents,
    prepare.json, logs) to archive/before-prepare-*/ one item at a time. Killed between two
    of those moves, the next prepare, with the new settings or the earlier ones, must move
    the rest there: no earlier document deleted (prepare.json went first, and the next
    prepare, finding none, deleted the documents as a half-made prepare's)."""
    good = _source(tmp_path, "good", ["alpha", "beta"])
    other = _source(tmp_path, "other", ["gamma"])
    run = tmp_path / "run"
    run_prepare(READ_WRITE, run, [good], progress=False)
    before = json.loads((run / "prepare.json").read_text())
    real_replace = os.replace

    def killed(src, dst, *args, **kwargs):
        if Path(src).name == killed_moving and "archive" in Path(dst).parts:
            raise Killed
        return real_replace(src, dst, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(prepare_outputs.os, "replace", killed)
        with pytest.raises(Killed):
            run_prepare(READ_WRITE, run, [other], progress=False)
    again = other if again_with == "other" else good
    run_prepare(READ_WRITE, run, [again], progress=False)
    archived = [f for f in (run / "archive").glob("before-prepare-*") if any(f.iterdir())]
    if killed_moving == "prepare" and again_with == "same":  # nothing had moved: a resume
        assert archived == [] and _texts(run) == ["alpha", "beta"]
        return
    (kept,) = archived  # one folder, finished
    assert json.loads((kept / "prepare.json").read_text()) == before
    assert _texts(kept) == ["alpha", "beta"]
    assert (kept / "prepare" / LAYOUT_FILE).is_file()
    assert _texts(run) == (["gamma"] if again_with == "other" else ["alpha", "beta"])


def test_a_kill_while_clearing_the_earlier_outputs_is_no_foreign_folder(tmp_path, monkeypatch):
    """`prepare.resume = false` deletes the earlier outputs. Killed while deleting logs/prepare
    after its pipeline record went, the next prepare refused the run as holding a
    logs/prepare Kiln did not write (set run.dir elsewhere, or clear it by hand)."""
    good = _source(tmp_path, "good", ["alpha", "beta"])
    run = tmp_path / "run"
    run_prepare(READ_WRITE, run, [good], progress=False)
    real_rmtree = shutil.rmtree
    logs = run / "logs" / "prepare"

    def killed(path, *args, **kwargs):
        path = Path(path)
        if path == logs or logs in path.parents:  # a kill partway through, the record
            (path / LAYOUT_FILE).unlink(missing_ok=True)  # (if in it) among the first gone
            raise Killed
        return real_rmtree(path, *args, **kwargs)

    again = PrepareConfig(stages=["read", "write"], resume=False)
    with monkeypatch.context() as m:
        m.setattr(prepare_outputs.shutil, "rmtree", killed)
        with pytest.raises(Killed):
            run_prepare(again, run, [good], progress=False)
    run_prepare(again, run, [good], progress=False)
    assert _texts(run) == ["alpha", "beta"]


def test_a_first_prepare_killed_as_it_records_its_pipeline_is_no_foreign_folder(tmp_path):
    """The first thing a prepare writes is its pipeline record, logs/prepare/kiln_pipeline.json
    (atomically). Killed between that file's write and its rename, it left only the temporary
    file there, and every later prepare (`kiln run` too) refused the run as holding a
    logs/prepare Kiln did not write."""
    from kill_points import kiln_killed_at

    from kiln.cli import main

    good = _source(tmp_path, "good", ["alpha", "beta"])
    run = tmp_path / "run"
    args = ["prepare", "--set", f'run.dir="{run}"', "--set", f'data.sources=["{good}"]',
            "--set", 'prepare.stages=["read", "write"]']
    kiln_killed_at("os:replace", *args, matching=LAYOUT_FILE)
    assert [p.name for p in (run / "logs" / "prepare").iterdir()][0].startswith(
        f".{LAYOUT_FILE}.tmp-")
    assert main(args) == 0
    assert _texts(run) == ["alpha", "beta"]
    assert not list((run / "logs" / "prepare").glob(".*.tmp-*"))
