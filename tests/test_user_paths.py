"""A researcher's first steps with their own data: the mistakes they make on the way are
one `kiln: ...` line that names the key or path and what to do, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cli import main
from kiln.config import ConfigError, load_config


def test_a_run_dir_under_a_file_is_a_config_error(tmp_path, monkeypatch, capsys):
    """`run.dir = "notes.txt/run"` used to crash with NotADirectoryError deep in prepare."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="lies under .*notes.txt', which is a file"):
        load_config(None, ['run.dir="notes.txt/run/deeper"'])
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.txt").write_text("some text\n")
    assert main(["prepare", "--set", 'run.dir="notes.txt/run"',
                 "--set", 'data.sources=["data"]']) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "which is a file, not a folder" in err
    load_config(None, ['run.dir="runs/new/deeper"'])  # folders not made yet are fine


def test_a_missing_relative_source_names_the_folder_it_was_looked_for_in(
        tmp_path, monkeypatch, capsys):
    """A recipe run from another folder: its relative source is looked for in the current
    folder, and the message says so (it used to say only `data source not found: 'data'`)."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", 'data.sources=["data"]']) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kiln: data.sources: 'data' does not exist")
    assert f"relative to the current folder {Path.cwd()}" in err and "\n" not in err
    missing = tmp_path / "nowhere"
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", f'data.sources=["{missing}"]']) == 1
    assert capsys.readouterr().err.strip() == \
        f"kiln: data.sources: '{missing}' does not exist"


def test_prepare_from_another_folder_resumes_the_same_sources(tmp_path, monkeypatch, capsys):
    """A recipe's relative source, prepared from its folder, then `kiln prepare RUN` from
    another folder (config.toml records the source absolute): the same sources and settings,
    so prepare resumes; it used to compare 'data' read against the new current folder, call
    them other sources and move the finished documents to archive/ to re-make them."""
    (tmp_path / "proj/data").mkdir(parents=True)
    (tmp_path / "proj/data/a.txt").write_text("A sentence of plain prose for the reader.\n")
    (tmp_path / "elsewhere").mkdir()
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "proj")
    assert main(["prepare", "--set", f'run.dir="{run}"', "--set", 'data.sources=["data"]',
                 "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1",
                 "--set", "prepare.workers=1"]) == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    assert "moved to" not in capsys.readouterr().err
    assert not (run / "archive").exists()
