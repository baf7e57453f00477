"""Set aside the records a resumed run trains again, streaming: metrics.jsonl of a days-long
run holds a million records (gigabytes where MoE loads are logged), and a resume must not
hold it in memory to move the few past its checkpoint."""

from __future__ import annotations

import contextlib
import filecmp
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from kiln.atomic import (
    archive_folders,
    atomic_path,
    clear_empty_archive_folders,
    new_archive_folder,
    recover_killed_swaps,
)

_CHUNK = 1 << 16


def _is_after(line: bytes, step: int) -> bool:
    """Whether `line` is a record of a step past `step` (a torn or foreign line is not)."""
    try:
        record_step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return False
    return isinstance(record_step, int) and not isinstance(record_step, bool) \
        and record_step > step


def _first_after(f: BinaryIO, step: int) -> int | None:
    """The byte offset of the first record past `step`, or None when there is none."""
    offset = 0
    for line in f:
        if _is_after(line, step):
            return offset
        offset += len(line)
    return None


def _copy_bytes(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    while n > 0:
        chunk = src.read(min(n, _CHUNK))
        if not chunk:
            return
        dst.write(chunk)
        n -= len(chunk)


def _whole_lines(f: BinaryIO) -> Iterator[bytes]:
    """Each line ending in a newline: a torn last line gets one, as each line keeps its own."""
    for line in f:
        yield line if line.endswith(b"\n") else line + b"\n"


def _holding_the_same(folders: list[Path], copy: Path) -> Path | None:
    """The first of `folders` whose metrics.jsonl has the bytes of `copy`."""
    for folder in folders:
        with contextlib.suppress(OSError):  # one without a metrics.jsonl
            if filecmp.cmp(folder / "metrics.jsonl", copy, shallow=False):
                return folder
    return None


def set_aside_records_after(run_dir: Path, step: int) -> Path | None:
    """A run resumed from its step-`step` checkpoint trains the later steps again: the
    records the abandoned stretch logged after that step (another schedule, another
    log_every) move to archive/after-step-{step}-{time}/metrics.jsonl, so metrics.jsonl
    and the report describe one run. Returns where they went, or None if there were none.
    Memory stays flat whatever the file's size; lines are kept byte for byte."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    with open(metrics, "rb") as f:
        first = _first_after(f, step)
    if first is None:
        return None
    label = f"after-step-{step}"
    for folder in archive_folders(run_dir, label):  # a kill while its copy was written
        recover_killed_swaps(folder / "metrics.jsonl")
    clear_empty_archive_folders(run_dir, label)  # that, or a kill just after one was made
    earlier = archive_folders(run_dir, label)
    dest = new_archive_folder(run_dir, label)
    # the archive's copy is in place before metrics.jsonl loses its lines: a kill loses none
    with atomic_path(metrics) as kept_tmp:
        with atomic_path(dest / "metrics.jsonl") as later_tmp, open(metrics, "rb") as src, \
                open(kept_tmp, "wb") as kept, open(later_tmp, "wb") as later:
            _copy_bytes(src, kept, first)  # every line before the first later one stays
            for line in _whole_lines(src):
                (later if _is_after(line, step) else kept).write(line)
        # a set-aside killed here, before metrics.jsonl lost the lines, archived them already
        # (the same bytes): one copy is kept
        placed = _holding_the_same(earlier, dest / "metrics.jsonl")
        if placed is not None:
            (dest / "metrics.jsonl").unlink()
            dest.rmdir()
            dest = placed
    return dest
