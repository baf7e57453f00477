"""An export killed between its two renames (`kiln.atomic.atomic_dir`: the previous export
moved aside to `.export.old-PID`, the new one not yet in place) leaves no `export/`. Every
reader of `export/` (the next export, the report, the trainer's and the archive's checks)
puts the previous export back first, and says so; torch-free, for the report."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.atomic import new_archive_folder, recover_killed_swaps, writer_killed

# what any export holds, whatever its format (a Hugging Face config.json or a native config.toml)
_WEIGHTS = "model.safetensors"
_CONFIGS = ("config.json", "config.toml")


def stranded_exports(out_dir: Path) -> list[Path]:
    """The previous exports moved aside beside `out_dir` by an export that has not put its
    own in place (killed, or still running)."""
    return sorted(Path(out_dir).parent.glob(f".{Path(out_dir).name}.old-*"))


def is_whole_export(out_dir: Path) -> bool:
    """A plain folder with an export's weights and config (not a folder a user started)."""
    out_dir = Path(out_dir)
    return out_dir.is_dir() and not out_dir.is_symlink() and (out_dir / _WEIGHTS).is_file() \
        and any((out_dir / c).is_file() for c in _CONFIGS)


def recover_export(out_dir: Path, run_dir: Path) -> str | None:
    """Put back the export a killed export left aside when `out_dir` is missing or not a
    whole export (what is there instead moves to run_dir/archive/ first: nothing is
    deleted); return what happened, or None when nothing was stranded."""
    out_dir = Path(out_dir)
    stranded = stranded_exports(out_dir)
    running = [p for p in stranded if not writer_killed(p)]
    if running and not is_whole_export(out_dir):
        return (f"{out_dir} is being replaced by a running export (process "
                f"{running[0].name.rsplit('-', 1)[1]}); the previous export is in {running[0]} "
                "until it finishes")
    if not any(writer_killed(p) for p in stranded):
        return None
    moved = ""
    if os.path.lexists(out_dir) and not is_whole_export(out_dir):
        dest = new_archive_folder(run_dir, "before-export-recovery") / out_dir.name
        os.replace(out_dir, dest)
        moved = f" (what was in {out_dir} instead moved to {dest})"
    restored = recover_killed_swaps(out_dir)
    if restored is None:  # a whole export is in place: the stranded one was older
        return None
    return (f"{out_dir} was missing: an export killed while replacing it had left the previous "
            f"export in {restored}; it is back in {out_dir}{moved}")
