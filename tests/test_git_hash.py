"""The git hash env.json and `kiln --version` record is Kiln's own commit, never that of a
repository Kiln happens to be installed inside."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import kiln.run_dir as run_dir


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_kiln_installed_in_another_projects_venv_records_no_commit(tmp_path, monkeypatch):
    """Kiln installed (not editable) into `my-project/.venv`, which my-project's git ignores:
    env.json recorded my-project's HEAD, `-dirty` with my-project's edits, as Kiln's commit."""
    project = tmp_path / "my-project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / ".gitignore").write_text(".venv/\n")
    (project / "notes.txt").write_text("mine\n")
    _git(project, "add", ".")
    _git(project, "-c", "user.email=u@example.com", "-c", "user.name=u", "commit", "-qm", "x")
    (project / "notes.txt").write_text("edited\n")
    installed = project / ".venv" / "lib" / "site-packages" / "kiln"
    shutil.copytree(Path(run_dir.__file__).parent, installed,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(run_dir, "__file__", str(installed / "run_dir.py"))
    assert run_dir.git_hash() == "unknown"
    assert "(git" not in run_dir.version_line()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_kiln_checkout_records_its_commit():
    here = Path(run_dir.__file__).resolve().parent
    try:
        head = _git(here, "rev-parse", "HEAD")
        _git(here, "ls-files", "--error-unmatch", "run_dir.py")
    except subprocess.CalledProcessError:
        pytest.skip("Kiln is not running from a git checkout")
    assert run_dir.git_hash().removesuffix("-dirty") == head
