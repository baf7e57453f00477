"""Build a folder beside its destination and swap it in only when it is complete."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of `path`; it replaces `path` only if the block succeeds.

    A reader (or a crash) sees the old folder or the new one, never a half-written mix;
    on failure the temporary folder is removed and any old `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            os.replace(path, old)  # a non-empty folder cannot be replaced in one rename
        try:
            os.replace(tmp, path)
        except OSError:
            if old.exists():
                os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
