"""A text whose split `write_shards` decides only at the end, held back on disk.

The train text with the smallest hash may have to move to an otherwise empty val split,
and the last val text to an otherwise empty train split. A text is all its documents (the
parts of a cut text share its hash): moved one part at a time, its other parts stayed on
the other side and val measured text trained on. On disk, not in memory: a cut text may be
a 20 GB dump (the reader reads it in a few MB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np


class TokenWriter(Protocol):
    def add(self, ids: np.ndarray, n_bytes: int) -> None: ...


class HeldText:
    """The documents of one text, each written to `path` as it comes and read back, in
    order, by `write_to`; `docs` holds (tokens, bytes) of each."""

    def __init__(self, path: Path, text_hash: float, dtype: np.dtype):
        self.path, self.hash, self.dtype = path, text_hash, dtype
        self._file = open(path, "wb")  # noqa: SIM115 (closed in write_to)
        self.docs: list[tuple[int, int]] = []

    def add(self, ids: np.ndarray, n_bytes: int) -> None:
        self._file.write(ids.astype(self.dtype).tobytes())
        self.docs.append((len(ids), n_bytes))

    def write_to(self, first: TokenWriter, n_first: int | None = None,
                 rest: TokenWriter | None = None) -> None:
        """Its documents, in order, to `first`, or only the first `n_first` of them and the
        others to `rest`; the file is removed."""
        self._file.close()
        if n_first is None or rest is None:
            n_first, rest = len(self.docs), first
        with open(self.path, "rb") as f:
            for k, (n_tokens, n_bytes) in enumerate(self.docs):
                ids = np.frombuffer(f.read(n_tokens * self.dtype.itemsize), dtype=self.dtype)
                writer = first if k < n_first else rest
                writer.add(ids.astype(np.int64), n_bytes)
        self.path.unlink()
