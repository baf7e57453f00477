"""Whether the disk has room for the next checkpoint, said before the save that would fail.

Why its own: a save writes a whole checkpoint before the oldest is pruned (`checkpoint`), so
a disk with less free space than one checkpoint fails the next save, `checkpoint_every`
steps on, and those steps are lost; said when it is first seen (after a save, or at a resume
onto such a disk), the user can free space while the run goes on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.report.fmt import fmt_bytes


def no_room_note(ckpt: Path) -> str:
    """A note when the disk under checkpoint `ckpt` has less free space than `ckpt` takes;
    "" when it has room, or the sizes cannot be read."""
    try:
        size = sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file())
        free = shutil.disk_usage(ckpt.parent).free
    except OSError:
        return ""
    if free >= size:
        return ""
    return (f"note: {ckpt.parent} has {fmt_bytes(free)} free, less than one checkpoint "
            f"({fmt_bytes(size)}, as {ckpt.name}): the next save will fail; free space before "
            "it, or lower train.keep_checkpoints (a resume prunes to it first)")
