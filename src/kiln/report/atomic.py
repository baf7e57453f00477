"""Atomic file writes, so a reader never sees a half-written report or plot."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; move it over ``path`` on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 via a temporary file and ``os.replace``."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
