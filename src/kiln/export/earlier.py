"""An export replaces the run's previous one whole (see `kiln.atomic.atomic_dir`): a folder
there holding what no export writes (a model card added before an upload, an adapter, a
folder of the user's own, a file named `export`) moves to the run's archive/ first, rather
than being deleted with it, and comes back if the export fails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from kiln.atomic import clear_empty_archive_folders, new_archive_folder, write_json_atomic
from kiln.export.hf_folder import HF_FILES
from kiln.export.native import FILES as NATIVE_FILES
from kiln.export_recovery import set_aside_record

EXPORT_FILES = frozenset(HF_FILES) | frozenset(NATIVE_FILES)


def other_files(out_dir: Path) -> str | None:
    """What `out_dir` holds that an export does not write, or None (nothing there, or only
    an export's own files)."""
    out_dir = Path(out_dir)
    if not os.path.lexists(out_dir):
        return None
    if out_dir.is_dir() and not out_dir.is_symlink():
        other = sorted(p.name for p in out_dir.iterdir()
                       if p.name not in EXPORT_FILES or not p.is_file() or p.is_symlink())
        if not other:
            return None
        return (f"held what an export does not write ({', '.join(other[:5])}"
                f"{', ...' if len(other) > 5 else ''})")
    # a link is moved, not followed: its target is left as it is
    return f"was a {'link' if out_dir.is_symlink() else 'file'}, not a folder"


@contextmanager
def other_files_set_aside(out_dir: Path, run_dir: Path) -> Iterator[str | None]:
    """Around an export to `out_dir`: move it to archive/before-export-<time>/ when it holds
    anything an export does not write, or is not a plain folder, and yield what was found
    and where it went (None: nothing moved). If the export fails, it is put back."""
    out_dir = Path(out_dir)
    clear_empty_archive_folders(run_dir, "before-export")  # a kill just after one was made
    what = other_files(out_dir)
    if what is None:
        yield None
        return
    dest = new_archive_folder(run_dir, "before-export") / out_dir.name
    # a kill skips the put-back below: the record lets the next reader of out_dir do it
    record = set_aside_record(out_dir, os.getpid())
    write_json_atomic(record, {"moved_to": str(dest.absolute())})
    try:
        os.replace(out_dir, dest)
    except FileNotFoundError:
        # another export of the run, starting, cleared the folder as a killed one's (empty)
        if dest.parent.is_dir() or not os.path.lexists(out_dir):
            record.unlink(missing_ok=True)
            raise
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out_dir, dest)
    try:
        yield f"{out_dir} {what}: it moved to {dest}"
    except BaseException:
        if not os.path.lexists(out_dir):  # the export wrote nothing there: as it was
            os.replace(dest, out_dir)
            dest.parent.rmdir()
            with suppress(OSError):  # an archive/ made for it alone goes too
                dest.parent.parent.rmdir()
        raise
    finally:
        record.unlink(missing_ok=True)
