"""Targets that hold a config.toml but are not a run directory as such: a native export
folder (taken for a run: `kiln generate RUN/export` told to run prepare there, `kiln report
RUN/export` wrote report.html into it), and a run's own config.toml named as the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiln import cli
from kiln.cli import main, resolve_config
from kiln.config import ConfigError, load_config, run_dir_override
from kiln.export.hf_folder import EXPORT_RECORD
from kiln.run_dir import write_run_metadata


def test_an_export_folder_is_not_taken_for_a_run(tmp_path, capsys):
    assert cli.EXPORT_RECORD is EXPORT_RECORD  # one name, defined once
    run = tmp_path / "run"
    write_run_metadata(load_config(None, [run_dir_override(run)]))
    export = run / "export"  # as kiln.export.native writes it
    export.mkdir()
    shutil.copy(run / "config.toml", export / "config.toml")
    (export / EXPORT_RECORD).write_text('{"format": "kiln-native"}')
    with pytest.raises(ConfigError, match=f"{export} is a Kiln export .*: give the run "
                       f"directory {run}$"):
        resolve_config(str(export), [])
    assert main(["report", str(export)]) == 2
    assert "is a Kiln export" in capsys.readouterr().err
    assert sorted(p.name for p in export.iterdir()) == sorted(["config.toml", EXPORT_RECORD])
    elsewhere = tmp_path / "models" / "m"  # copied out of its run
    shutil.copytree(export, elsewhere)
    with pytest.raises(ConfigError, match="give the run directory it was exported from$"):
        resolve_config(str(elsewhere), [])
    assert resolve_config(str(run), []).run_dir == run  # the run itself, as before


def test_a_runs_own_config_toml_names_that_run_from_any_folder(tmp_path, monkeypatch):
    """`kiln eval RUN/config.toml` from another folder read the run.dir recorded in it,
    relative to the folder the run was started from: another run ("no checkpoint"), or a
    new one for `kiln run`. Copied out with --set run.dir it is still a recipe."""
    monkeypatch.chdir(tmp_path)
    write_run_metadata(load_config(None, ['run.dir="r"']))  # recorded as given: relative
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    own = tmp_path / "r" / "config.toml"
    assert resolve_config(str(own), []).run_dir.resolve() == (tmp_path / "r").resolve()
    assert resolve_config(str(own), ['run.dir="new"']).run_dir == Path("new")  # a recipe


def test_a_file_that_is_no_recipe_is_refused_naming_what_was_expected(tmp_path, monkeypatch,
                                                                     capsys):
    """`kiln run notes.txt` (or an empty file, or /dev/null) was read as TOML: an empty
    recipe, so the defaults, and the quickstart trained in runs/quickstart."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").touch()
    (tmp_path / "notes.txt").write_text("# my notes\n")
    (tmp_path / "recipe").write_text("[train]\nsteps = 5\n")  # TOML, but not named so
    for target in ("empty", "notes.txt", "recipe", "/dev/null"):
        with pytest.raises(ConfigError, match=f"^{target} is not a TOML recipe or a run "
                           r"directory: give a recipe \(a file ending in .toml\) or a run "
                           r"directory \(a folder holding config.toml\)$"):
            resolve_config(target, [])
    assert main(["run", "empty"]) == 2
    assert "empty is not a TOML recipe" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing made, nothing run
    (tmp_path / "recipe.TOML").write_text("[train]\nsteps = 5\n")
    assert resolve_config("recipe.TOML", []).train.steps == 5  # a recipe, however cased


def test_an_empty_target_is_named_as_given(tmp_path, monkeypatch):
    """`kiln eval ""` (an unset shell variable, quoted) was told '. is not a run directory':
    Path("") is the current folder, which the user never named."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^the target is empty \(''\): give a recipe \(a file "
                       r"ending in .toml\) or a run directory$"):
        resolve_config("", [])
