"""Which checkpoint folders a run has, from their names and files alone (no torch import:
the report reads them too)."""

from __future__ import annotations

import os
import re
from pathlib import Path

PREFIX = "step_"
_NAME = re.compile(rf"{PREFIX}(\d+)")


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint folder is named for; None for any other name (a folder a user
    moved aside as `step_00000200.bad` is neither resumed from nor pruned)."""
    match = _NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """Fully written checkpoint folders (trainer.pt is saved last), oldest first."""
    found = [p for p in Path(ckpt_root).glob(f"{PREFIX}*")
             if checkpoint_step(p) is not None and (p / "trainer.pt").exists()]
    return sorted(found, key=checkpoint_step)


def pointed_name(pointer: Path) -> str:
    """The checkpoint folder the `latest` pointer names; "" for none: no pointer, or one
    damaged on disk (bytes that are not text, a folder, a path out of checkpoints/), which
    the newest complete checkpoint then stands in for, as for a pointer naming one gone."""
    try:
        name = Path(pointer).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return name if Path(name).name == name else ""


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names, or the newest complete one if the pointer is gone."""
    name = pointed_name(Path(ckpt_root) / "latest")
    if name:
        candidate = Path(ckpt_root) / name
        if checkpoint_step(candidate) is not None and (candidate / "trainer.pt").exists():
            return candidate
    done = complete_checkpoints(ckpt_root)
    return done[-1] if done else None


def passed_over(ckpt_root: Path, used: Path) -> str:
    """What `latest` names where checkpoint `used` was taken in its place, and why (gone:
    moved aside by hand; no trainer.pt: a file of it removed, as a write never leaves one);
    "" where it names `used`, or there is no pointer. Said by a resume (it trains those
    steps again) and by eval, generate and export (they read an older model)."""
    pointer = Path(ckpt_root) / "latest"
    if not os.path.lexists(pointer):
        return ""
    name = pointed_name(pointer)
    if name == used.name:
        return ""
    if not name:
        return "checkpoints/latest is damaged"
    named = Path(ckpt_root) / name
    if checkpoint_step(named) is not None and (named / "trainer.pt").exists():
        return ""  # complete: `used` was chosen (a trainer pointed `latest` on since)
    why = ("gone" if not named.exists() else
           "not a checkpoint's name" if checkpoint_step(named) is None else
           "not a complete checkpoint (no trainer.pt)")
    return f"checkpoints/latest names {name}, which is {why}"
