"""An earlier model's outputs on their way to archive/ (`archive_checkpoints`): the folder
holds a marker until the last of them has moved, so that a fresh start killed between two
moves is finished by the next command (plain or `--fresh`) into that same folder, not split
over two archive folders with the next one asked for by hand.

Why its own: which archive folders are unfinished is read by the trainer before it resumes
(a fresh start cut short is gone on with, not resumed) and by the archiving itself.
"""

from __future__ import annotations

from pathlib import Path

from kiln.atomic import archive_folders, clear_empty_archive_folders, fsync_dir

UNFINISHED = ".unfinished"  # in archive/before-{fresh,restart}-*/ while outputs move in
_LABELS = ("before-fresh", "before-restart")


def _start_folders(run_dir: Path) -> list[Path]:
    """The archive folders of fresh starts and restarts, oldest first (by their time)."""
    found = [(f.name[len(label) + 1:], f) for label in _LABELS
             for f in archive_folders(run_dir, label)]
    return [f for _, f in sorted(found)]


def unfinished_archive(run_dir: Path) -> Path | None:
    """The archive folder a start killed while it moved the earlier outputs had begun."""
    marked = [f for f in _start_folders(run_dir) if (f / UNFINISHED).is_file()]
    return marked[-1] if marked else None


def starting_over(run_dir: Path, fresh: bool) -> bool:
    """Whether the model starts again from step 0: `--fresh`, or a fresh start (or restart)
    cut short that the next command goes on with (`Trainer` finishes its archive)."""
    return fresh or unfinished_archive(run_dir) is not None


def unfinished_reason(folder: Path) -> str:
    """"fresh" or "restart": what the start that began `folder` was."""
    return "fresh" if folder.name.startswith("before-fresh-") else "restart"


def mark_unfinished(folder: Path) -> None:
    """Mark `folder` (just made, empty) as an archive in progress, durably, before any
    output moves in. A kill before this leaves the empty folder `clear_empty` removes."""
    (folder / UNFINISHED).touch()
    fsync_dir(folder)


def mark_finished(folder: Path) -> None:
    (folder / UNFINISHED).unlink(missing_ok=True)
    fsync_dir(folder)


def clear_empty(run_dir: Path) -> None:
    """Fresh-start and restart archive folders left empty by a kill just after one was made,
    before its marker."""
    for label in _LABELS:
        clear_empty_archive_folders(run_dir, label)
