"""sha256 of a file's bytes: read back in blocks, or taken as they are written (checkpoints
run to gigabytes: a second full read of each costs as long as the hashing)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """The hex sha256 of the file at `path`."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class HashingWriter:
    """A binary file open for writing that hashes every byte written through it, so the
    checksum of a file comes with writing it (`torch.save` takes it as its file)."""

    def __init__(self, path: Path | str) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close / the with block)
        self._sha = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self._sha.update(data)  # hashlib and the write both let go of the GIL for big buffers
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def hexdigest(self) -> str:
        """The hex sha256 of everything written so far."""
        return self._sha.hexdigest()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
