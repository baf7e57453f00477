"""An earlier model's outputs on their way to archive/ (`archive_checkpoints`): the folder
holds a marker until the last of them has moved, so that a fresh start killed between two
moves is finished by the next command (plain or `--fresh`) into that same folder, not split
over two archive folders with the next one asked for by hand. With them go copies of the
records that say what that model was (config.toml, model.json, env.json).

Why its own: which archive folders are unfinished is read by the trainer before it resumes
(a fresh start cut short is gone on with, not resumed), by the archiving itself, and by the
data verbs, which keep the earlier model's records before they write their own (torch-free).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.atomic import (
    archive_folders,
    atomic_dir,
    atomic_path,
    clear_empty_archive_folders,
    fsync_dir,
)

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


# what the archived model is (its settings, figures, versions): copied, the run keeps its
# own until the new training records the new ones; a new model.dim would leave the archived
# checkpoints with no config that builds them
_RECORDS = ("config.toml", "model.json", "env.json")


# the earlier model's config.toml and env.json, kept where a data verb records its own
# before that model's outputs are archived (`keep_earlier_records`)
EARLIER_RECORDS = Path("logs") / "earlier-model"


def copy_records(run_dir: Path, dest: Path) -> None:
    """Copies of the archived model's records into its archive folder `dest` (those kept
    before a data verb recorded its own, else the run's)."""
    kept = run_dir / EARLIER_RECORDS
    for name in _RECORDS:
        src = kept / name if (kept / name).is_file() else run_dir / name
        if src.is_file() and not (dest / name).exists():
            with atomic_path(dest / name) as tmp:
                shutil.copyfile(src, tmp)
    shutil.rmtree(kept, ignore_errors=True)


def keep_earlier_records(run_dir: Path) -> None:
    """Before a data verb (or `kiln run`'s data stages) records its config.toml and env.json
    over the run's, where an earlier model's outputs are still to be archived (its metrics
    and no checkpoint: the restart at step 0 to come; a fresh start cut short): copies of the
    earlier ones, kept once, for that archive. The restart's archive took the new config
    (a run killed before its first checkpoint, run again with a new model.dim or
    micro_batch) beside the earlier model's metrics and model.json."""
    run_dir = Path(run_dir)
    kept = run_dir / EARLIER_RECORDS
    metrics = run_dir / "metrics.jsonl"
    pending = unfinished_archive(run_dir) is not None or (
        metrics.is_file() and metrics.stat().st_size > 0)
    if not pending or kept.is_dir() or not (run_dir / "config.toml").is_file():
        return
    with atomic_dir(kept) as tmp:
        for name in ("config.toml", "env.json"):
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, tmp / name)


def drop_earlier_records(run_dir: Path) -> None:
    """The new model's records are written: kept copies no archive took describe outputs
    that are gone (moved away by hand), and must not describe a later archive."""
    shutil.rmtree(Path(run_dir) / EARLIER_RECORDS, ignore_errors=True)
