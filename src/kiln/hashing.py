"""sha256 of a file's bytes, read in blocks (checkpoints run to gigabytes)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """The hex sha256 of the file at `path`."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
