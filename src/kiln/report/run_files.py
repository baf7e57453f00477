"""Load the optional inputs of a run directory without ever raising.

A report is most useful exactly when a run went wrong, so a missing or corrupt
file becomes a ``Loaded`` with a ``problem`` that its section prints instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln import strict_json
from kiln.report.metrics_io import read_metrics
from kiln.train.checkpoint_dirs import latest_checkpoint


@dataclass
class Loaded:
    """One input file: its value, or why it could not be had."""

    name: str
    value: Any = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _missing_or_unreadable(name: str, path: Path, error: Exception) -> Loaded:
    if isinstance(error, FileNotFoundError) or not path.exists():
        return Loaded(name, problem=f"{name} missing")
    return Loaded(name, problem=f"{name} unreadable: {error}")


def load_text(run_dir: Path, name: str) -> Loaded:
    """The file's text, decoded as UTF-8 with replacement characters."""
    path = run_dir / name
    try:
        return Loaded(name, path.read_text(encoding="utf-8", errors="replace"))
    except OSError as error:
        return _missing_or_unreadable(name, path, error)


def load_json(run_dir: Path, name: str, expect: type = dict) -> Loaded:
    """The file parsed as JSON, required to be of type ``expect`` (a damaged one nested past
    the recursion limit is unreadable too, not a traceback)."""
    path = run_dir / name
    try:
        value = strict_json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError) as error:
        return _missing_or_unreadable(name, path, error)
    if not isinstance(value, expect):
        kind = "object" if expect is dict else "array" if expect is list else expect.__name__
        return Loaded(name, problem=f"{name} unreadable: expected a JSON {kind}")
    return Loaded(name, value)


def load_metrics(run_dir: Path, name: str = "metrics.jsonl") -> Loaded:
    """The deduplicated metric records (see ``read_metrics``)."""
    path = run_dir / name
    try:
        return Loaded(name, read_metrics(path))
    except OSError as error:
        return _missing_or_unreadable(name, path, error)


def latest_checkpoint_name(run_dir: Path) -> str | None:
    """The checkpoint eval, generate and export would use now (never raises)."""
    try:
        found = latest_checkpoint(Path(run_dir) / "checkpoints")
    except (OSError, UnicodeDecodeError):
        return None
    return found.name if found else None
