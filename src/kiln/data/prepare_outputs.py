"""Prepare's output folders, cleared before a new pipeline writes them: never ones Kiln did
not write, and a finished earlier prepare's documents archived rather than deleted."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from kiln.atomic import new_archive_folder, recover_killed_swaps
from kiln.data.stage_registry import WORK_DIR
from kiln.data.yield_report import LAYOUT_FILE
from kiln.errors import ConfigError

_OUTPUT_FOLDERS = ("documents", "rejected", WORK_DIR, "logs/prepare")


def _refuse_foreign_folders(run_dir: Path) -> None:
    """prepare replaces its output folders: never ones it did not write (a user's own
    `documents/` in a folder chosen as run.dir). Kiln's prepare records its pipeline in
    logs/prepare before it writes any of them."""
    record = run_dir / "logs" / "prepare" / LAYOUT_FILE
    if record.parent.is_dir():  # a prepare killed as it wrote the record left its temporary file
        recover_killed_swaps(record)
    if record.is_file() or (run_dir / "prepare.json").is_file():
        return
    foreign = [name for name in _OUTPUT_FOLDERS if (run_dir / name).is_file()
               or ((run_dir / name).is_dir() and any((run_dir / name).iterdir()))]
    if foreign:
        raise ConfigError(f"run.dir {run_dir} already holds {', '.join(foreign)}, "
                          "which `kiln prepare` did not write and would replace: set run.dir "
                          "to another folder (or move them away)")


# moved in this order, prepare.json last: while it is in the run, what is left there is a
# finished prepare's, and a prepare killed between two moves has the next one finish them
_ARCHIVED = ("logs/prepare", "rejected", "yield.json", "documents", "prepare.json")
_ARCHIVE_LABEL = "before-prepare"


def clear_outputs(run_dir: Path, keep_earlier: bool, earlier_rules: Sequence[str] = ()) -> None:
    """Out of the new pipeline's way. With `keep_earlier` (other settings or sources, or
    `earlier_rules`: RULE_MARKERS' words for the rules of an earlier Kiln that made them), a
    finished earlier prepare's documents move to archive/before-prepare-*/ (a re-make with a
    wrong source or an over-eager filter must not throw hours of work away); a re-make of
    the same (prepare.resume = false) and an unfinished one's partial outputs go."""
    _refuse_foreign_folders(run_dir)
    unfinished = _unfinished_archive(run_dir)
    if keep_earlier and (run_dir / "prepare.json").is_file() and (
            (run_dir / "documents").is_dir() or unfinished):
        dest = unfinished or new_archive_folder(run_dir, _ARCHIVE_LABEL)
        for name in _ARCHIVED:
            if (run_dir / name).exists():
                os.replace(run_dir / name, dest / Path(name).name)
        # a rule of this Kiln, not a setting the user never changed, is why (every pii run
        # once PII_RULES is bumped)
        why = (f"documents whose {', and whose '.join(earlier_rules)}: this Kiln makes them "
               "otherwise" if earlier_rules else "made with other settings or sources")
        print(f"prepare: the earlier documents ({why}) moved to {dest}; delete it once the "
              "new ones are right", file=sys.stderr)
    for name in ("prepare.json", "yield.json"):
        (run_dir / name).unlink(missing_ok=True)
    for folder in _OUTPUT_FOLDERS:
        _remove_folder(run_dir / folder)


def _unfinished_archive(run_dir: Path) -> Path | None:
    """The archive folder a prepare killed while moving the earlier documents there had
    begun (prepare.json, moved last, not in it yet), for the rest to join them."""
    folders = sorted((run_dir / "archive").glob(f"{_ARCHIVE_LABEL}-*"), key=lambda p: p.name)
    return next((f for f in reversed(folders)
                 if f.is_dir() and not (f / "prepare.json").exists()), None)


def _remove_folder(folder: Path) -> None:
    """Delete one of prepare's folders; its pipeline record, which tells it from a user's
    folder, goes last, so that a prepare killed partway leaves it Kiln's (the next one
    clears it rather than refusing the run)."""
    record = folder / LAYOUT_FILE
    if record.is_file() and not folder.is_symlink():
        for entry in folder.iterdir():
            if entry == record:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
