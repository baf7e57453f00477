"""A text whose split `write_shards` decides only at the end, held back.

The train text with the smallest hash may have to move to an otherwise empty val split,
and the last val text to an otherwise empty train split. A text is all its documents (the
parts of a cut text share its hash): moved one part at a time, its other parts stayed on
the other side and val measured text trained on. Held in memory up to `MEMORY_TOKENS`, on
disk past it: a cut text may be a 20 GB dump (the reader reads it in a few MB).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

# tokens of a held text kept in memory (32 MB as int64); the rest goes to its file
MEMORY_TOKENS = 1 << 22


class TokenWriter(Protocol):
    def add(self, ids: np.ndarray, n_bytes: int) -> None: ...


class HeldText:
    """The documents of one text, in order: the first in memory, those past `MEMORY_TOKENS`
    in the file `path` (made only then); `docs` holds (tokens, bytes) of each."""

    def __init__(self, path: Path, text_hash: float, dtype: np.dtype):
        self.path, self.hash, self.dtype = path, text_hash, dtype
        self.docs: list[tuple[int, int]] = []
        self._in_memory: list[np.ndarray] = []
        self._memory_tokens = 0
        self._file = None

    def add(self, ids: np.ndarray, n_bytes: int) -> None:
        self.docs.append((len(ids), n_bytes))
        if self._file is None and self._memory_tokens + len(ids) <= MEMORY_TOKENS:
            self._in_memory.append(ids)
            self._memory_tokens += len(ids)
            return
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed in write_to)
        self._file.write(ids.astype(self.dtype).tobytes())

    def write_to(self, first: TokenWriter, n_first: int | None = None,
                 rest: TokenWriter | None = None) -> None:
        """Its documents, in order, to `first`, or only the first `n_first` of them and the
        others to `rest`; its file is removed."""
        if n_first is None or rest is None:
            n_first, rest = len(self.docs), first
        for k, ids in enumerate(self._documents()):
            (first if k < n_first else rest).add(ids, self.docs[k][1])

    def _documents(self) -> Iterator[np.ndarray]:
        yield from self._in_memory
        if self._file is None:
            return
        self._file.close()
        with open(self.path, "rb") as f:
            for n_tokens, _ in self.docs[len(self._in_memory):]:
                ids = np.frombuffer(f.read(n_tokens * self.dtype.itemsize), dtype=self.dtype)
                yield ids.astype(np.int64)
        self.path.unlink()
