"""Atomic writes: a reader (or a crash) sees the old file or folder or the new one, never half.

Every output Kiln writes — configs, metrics summaries, tokenizers, shards' index, reports,
exports, checkpoints — goes through these helpers.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln import strict_json
from kiln.errors import RunDataError


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_target(path: Path | str) -> Path:
    """`path`, or where it links to: a file or folder the user linked elsewhere (token shards
    on a larger disk) is replaced there, and the link kept, not replaced by a local copy."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def make_room(path: Path, folder: bool) -> None:
    """Create `path`'s parent folders; refuse, naming it, a file where a folder must be or
    the other way round (a file `RUN/plots` the user made), before anything is written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        blocker = next((p for p in reversed(path.parents)
                        if os.path.lexists(p) and not p.is_dir()), path.parent)
        what = ("a file" if not blocker.is_symlink() else f"a link to {os.readlink(blocker)}, "
                + ("a file," if blocker.exists() else "which is missing,"))
        raise RunDataError(f"cannot write {path}: {blocker} is {what} where Kiln keeps a "
                           "folder; move it aside and run it again") from e
    if path.exists() and path.is_dir() != folder:
        kind = "file" if path.is_file() else "folder"
        raise RunDataError(f"cannot write {path}: a {kind} of that name is in the way; move "
                           "it aside and run it again")


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling of `path` (of its target, if a link); it replaces `path`
    only if the block succeeds."""
    path = link_target(path)
    make_room(path, folder=False)
    recover_killed_swaps(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path | str, obj: object) -> None:
    """Strict JSON: a non-finite float is written as null and named (`kiln.strict_json`)."""
    write_text_atomic(path, strict_json.dumps(obj, indent=2) + "\n")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def process_gone(pid: str) -> bool:
    """Whether process `pid` (digits from a file's name) of this host is gone. Our own pid
    in a leftover's name is a killed predecessor's (a container restarts as pid 1)."""
    return pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid)))


def writer_killed(stale: Path) -> bool:
    """Whether the writer that left `stale` (a `.tmp-PID` or `.old-PID` sibling) is gone;
    one still alive is in the middle of its swap."""
    return process_gone(stale.name.rsplit("-", 1)[1])


def recover_killed_swaps(path: Path) -> Path | None:
    """Clear what a writer killed inside `atomic_dir` or `atomic_path` left beside `path`:
    its half-written `.tmp-PID` file or folder goes; its `.old-PID` folder (the previous complete version, moved
    aside just before the swap) is put back if `path` is missing, else it goes too. Folders
    of writers still alive are left to them. Returns the `.old-PID` folder put back, if any."""
    restored = None
    for kind in ("old", "tmp"):  # old first: it may have to be restored
        for stale in path.parent.glob(f".{path.name}.{kind}-*"):
            if not writer_killed(stale):
                continue
            if kind == "old" and not path.exists():
                os.replace(stale, path)
                restored = stale
            elif stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    return restored


@contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield an empty temporary sibling folder of `path` (of its target, if a link); it
    replaces `path` only on success.

    A non-empty folder cannot be replaced by one rename, so the old one is moved aside
    first and restored if the swap fails. It is moved aside only once the new one is whole
    on disk: a `.tmp-PID` beside a killed writer's `.old-PID` is complete (see
    `kiln.export_recovery.finished_copy`).
    """
    path = link_target(path)
    make_room(path, folder=True)
    recover_killed_swaps(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        # the folders' entries too: once the old folder is moved aside, the new one must be
        # whole on disk (a reader finishing a killed swap relies on it)
        for d in [tmp, *(d for d in tmp.rglob("*") if d.is_dir() and not d.is_symlink())]:
            fsync_dir(d)
        if path.exists():
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except OSError:
            if old.exists():
                os.replace(old, path)
            raise
        fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def archive_folders(run_dir: Path, label: str) -> list[Path]:
    """run_dir/archive/{label}-{time}[-n]/ folders, oldest first."""
    found = (Path(run_dir) / "archive").glob(f"{label}-*")
    return sorted((f for f in found if re.fullmatch(rf"{re.escape(label)}-\d{{8}}-\d{{6}}(-\d+)?",
                                                     f.name)), key=lambda f: f.name)


def clear_empty_archive_folders(run_dir: Path, label: str) -> None:
    """{label} archive folders left empty: a kill just after `new_archive_folder` made one,
    before anything moved in (they hold nothing; rmdir removes an empty folder alone)."""
    for folder in archive_folders(run_dir, label):
        with contextlib.suppress(OSError):
            folder.rmdir()


def new_archive_folder(run_dir: Path, label: str) -> Path:
    """A new, empty run_dir/archive/{label}-{UTC time}[-n]/ for outputs moved aside (never
    deleted) when a run starts over or re-makes them."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1, 10_000):
        dest = Path(run_dir) / "archive" / (f"{label}-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            dest.mkdir(parents=True)  # atomic: two archivers in one second get two folders
            return dest
        except FileExistsError:
            continue
    raise FileExistsError(f"{Path(run_dir) / 'archive'}: no free name for {label}-{stamp}")
