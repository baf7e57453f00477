"""An export killed between its two renames (`kiln.atomic.atomic_dir`: the previous export
moved aside to `.export.old-PID`, the new one, complete, still in `.export.tmp-PID`) leaves no
`export/`. Every reader of a run's `export/` (the next export, the report, the trainer's and
the archive's checks) finishes that swap first, and says so: the new export goes in when it
is provably complete, else the previous one comes back. Torch-free, for the report."""

from __future__ import annotations

import json
import os
from contextlib import suppress
from pathlib import Path

from kiln.atomic import new_archive_folder, recover_killed_swaps, writer_killed

# what any export holds, whatever its format (a Hugging Face config.json or a native config.toml)
_WEIGHTS = "model.safetensors"
_CONFIGS = ("config.json", "config.toml")
EXPORT_RECORD = "kiln_export.json"  # written by every export: its format and checkpoint
_RUN_RECORDS = ("config.toml", "env.json")  # kiln.run_dir.write_run_metadata's


def set_aside_record(out_dir: Path, pid: int | str = "*") -> Path:
    """Where `kiln.export.earlier.other_files_set_aside` notes, while its export runs, the
    archive folder it moved `out_dir` to (pid "*": a glob for every writer's)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.set-aside-{pid}"


def _put_back_set_aside(out_dir: Path) -> str | None:
    """A killed export had moved `out_dir` (holding what an export does not write) to the
    archive: it comes back if that export put nothing in its place, as after a failed
    export; else it stays there, as after a whole one, and the note says where."""
    notes = []
    for record in sorted(out_dir.parent.glob(set_aside_record(out_dir).name)):
        if not writer_killed(record):
            continue
        try:
            dest = Path(json.loads(record.read_text())["moved_to"])
        except (OSError, ValueError, KeyError, TypeError):
            dest = None
        if dest is not None and os.path.lexists(dest):
            if not os.path.lexists(out_dir):
                os.replace(dest, out_dir)
                notes.append(f"an export killed while replacing {out_dir} had moved it to "
                             f"{dest}; it is back in {out_dir}")
            else:
                notes.append(f"an export killed after replacing {out_dir} had moved what it "
                             f"held that an export does not write to {dest}")
        for folder in (dest.parent, dest.parent.parent) if dest is not None else ():
            with suppress(OSError):  # emptied by the put-back (or by a kill before the move)
                folder.rmdir()
        record.unlink(missing_ok=True)
    return "; ".join(notes) or None


def stranded_exports(out_dir: Path) -> list[Path]:
    """The previous exports moved aside beside `out_dir` by an export that has not put its
    own in place (killed, or still running)."""
    return sorted(Path(out_dir).parent.glob(f".{Path(out_dir).name}.old-*"))


def is_whole_export(out_dir: Path) -> bool:
    """A plain folder with an export's weights and config (not a folder a user started)."""
    out_dir = Path(out_dir)
    return out_dir.is_dir() and not out_dir.is_symlink() and (out_dir / _WEIGHTS).is_file() \
        and any((out_dir / c).is_file() for c in _CONFIGS)


def holds_exported_model(out_dir: Path) -> bool:
    """`out_dir` holds an export's weights or config (one written before Kiln recorded
    `EXPORT_RECORD` has no record): not an empty folder, or one of the user's alone."""
    return any((Path(out_dir) / name).is_file() for name in (_WEIGHTS, *_CONFIGS))


def is_run_export(out_dir: Path) -> bool:
    """`out_dir` is a Kiln run's `export/`: the only place a reader may repair a killed
    export (anywhere else the folders beside it are not Kiln's to move)."""
    out_dir = Path(out_dir)
    return out_dir.name == "export" and all((out_dir.parent / f).is_file() for f in _RUN_RECORDS)


def finished_copy(old: Path) -> Path | None:
    """The new export a writer killed between its two renames had finished, beside its
    `.old-PID` folder: `atomic_dir` moves the previous export aside only once every file
    of the new one is written and synced, so a `.tmp-PID` of the same dead writer next to
    it is complete (and must hold an export's weights, config and record). None otherwise:
    a `.tmp-PID` alone may be half-written."""
    pid = old.name.rsplit("-", 1)[1]
    name = old.name.removeprefix(".").rsplit(".old-", 1)[0]
    new = old.with_name(f".{name}.tmp-{pid}")
    if not (writer_killed(old) and is_whole_export(new) and (new / EXPORT_RECORD).is_file()):
        return None
    try:
        return new if "format" in json.loads((new / EXPORT_RECORD).read_text()) else None
    except (OSError, ValueError, TypeError):
        return None


def describe_stranded(out_dir: Path) -> str | None:
    """What a killed or running export left beside `out_dir`, said without touching it
    (for a reader outside a Kiln run); None when nothing is there or `out_dir` is whole."""
    out_dir = Path(out_dir)
    stranded = stranded_exports(out_dir)
    if not stranded or is_whole_export(out_dir):
        return None
    finished = [f for f in map(finished_copy, stranded) if f is not None]
    where = (f"the complete new export in {finished[0]} (the previous one in "
             f"{', '.join(map(str, stranded))})" if finished
             else f"the previous export in {', '.join(map(str, stranded))}")
    return (f"{out_dir} is {'not a whole export' if os.path.lexists(out_dir) else 'missing'}: "
            f"an export killed (or still running) while replacing it left {where}; nothing "
            f"was moved (outside a Kiln run's export/ folders are only read): move it to "
            f"{out_dir} to load it")


def recover_export(out_dir: Path, run_dir: Path) -> str | None:
    """Finish the swap of a killed export when `out_dir` is missing or not a whole export:
    the new export it had completed goes in, or else the previous export it left aside
    comes back (what is there instead moves to run_dir/archive/ first: nothing the user made
    is deleted); a folder of the user's it had moved to the archive comes back if no export
    took its place. Return what happened, or None when nothing was stranded."""
    out_dir = Path(out_dir)
    notes = [_finish_swap(out_dir, run_dir), _put_back_set_aside(out_dir)]
    return "; ".join(n for n in notes if n) or None


def _finish_swap(out_dir: Path, run_dir: Path) -> str | None:
    stranded = stranded_exports(out_dir)
    running = [p for p in stranded if not writer_killed(p)]
    if running and not is_whole_export(out_dir):
        return (f"{out_dir} is being replaced by a running export (process "
                f"{running[0].name.rsplit('-', 1)[1]}); the previous export is in {running[0]} "
                "until it finishes")
    killed = [p for p in stranded if writer_killed(p)]
    if not killed:
        return None
    moved = ""
    if os.path.lexists(out_dir) and not is_whole_export(out_dir):
        dest = new_archive_folder(run_dir, "before-export-recovery") / out_dir.name
        os.replace(out_dir, dest)
        moved = f" (what was in {out_dir} instead moved to {dest})"
    finished = sorted((f for f in map(finished_copy, killed) if f is not None),
                      key=lambda f: f.stat().st_mtime)
    if not os.path.lexists(out_dir) and finished:
        os.replace(finished[-1], out_dir)  # the rename the killed export did not make
        recover_killed_swaps(out_dir)  # the previous export goes, as after any export
        return (f"{out_dir} was missing: an export killed while replacing it had finished the "
                f"new export in {finished[-1]}; it is now in {out_dir}, replacing the previous "
                f"one as the export would have{moved}")
    restored = recover_killed_swaps(out_dir)
    if restored is None:  # a whole export is in place: the stranded one was older
        return None
    return (f"{out_dir} was missing: an export killed while replacing it had left the previous "
            f"export in {restored}; it is back in {out_dir}{moved}")
