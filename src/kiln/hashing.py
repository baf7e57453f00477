"""sha256 of a file's bytes: read back in blocks, or taken as they are written (checkpoints
run to gigabytes: a second full read of each costs as long as the hashing)."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """The hex sha256 of the file at `path`."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# a write at least this large is hashed on a second thread while it is written
_OVERLAP_BYTES = 1 << 20


class HashingWriter:
    """A binary file open for writing that hashes every byte written through it, so the
    checksum of a file comes with writing it (`torch.save` takes it as its file). A large
    write is hashed on another thread while this one writes it (both let go of the GIL):
    the hashing costs no time of its own where a second core is free."""

    def __init__(self, path: Path | str) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close / the with block)
        self.name = str(path)  # as a file object's
        self._sha = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        # the file's own error (a full disk): torch.save's zip writer drops it and fails
        # later on its own check, so its caller reads it here
        self.failure: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        try:
            return self._write(memoryview(data))
        except OSError as e:
            self.failure = e
            raise

    def _write(self, view: memoryview) -> int:
        if view.nbytes < _OVERLAP_BYTES:
            self._sha.update(view)
            return self._file.write(view)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        hashed = self._pool.submit(self._sha.update, view)
        try:
            return self._file.write(view)
        finally:  # done with `data` before returning it to the caller
            hashed.result()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._file.close()

    def hexdigest(self) -> str:
        """The hex sha256 of everything written so far."""
        return self._sha.hexdigest()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
