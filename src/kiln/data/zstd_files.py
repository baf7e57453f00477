"""Zstandard (`.zst`) files opened for reading as gzip, bz2 and lzma files are: a binary
stream that raises `EOFError` where the file is cut off, and the library's `ZstdError` where
it is damaged, so the reader treats a cut `.jsonl.zst` as it does a cut `.jsonl.gz`.

`zstandard`'s own `stream_reader` ends quietly at a cut (a truncated download would read as a
shorter file, its loss unseen), so frames are decoded here with `decompressobj`, one after
another (a file may hold many: `zstd` run on several inputs, streaming writers, skippable
frames), and the end of the file inside a frame is an `EOFError`. A frame without its content
size (written by a stream) needs nothing more.
"""

from __future__ import annotations

import io
from pathlib import Path

import zstandard

# The largest window a frame may declare (a window log of 31: `zstd --long=31`). The decoder
# allocates only the window a frame declares, not this bound; below it, a file written with
# `--long` (the default `--long` is 128 MiB, which is libzstd's default bound too) or past it
# would be unreadable. Reading such a file needs its window of memory in any decoder.
MAX_WINDOW_BYTES = 1 << 31

# Compressed bytes fed to the decoder at a time: what one feed decodes to is held at once, and
# zstd's most repetitive data (a run of one byte) expands about 32,000 times: 128 MiB at most.
READ_BYTES = 4 << 10
WRITE_BYTES = 32 << 10  # the decoder's output chunk


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of a zstd stream `raw` (read, and closed, by this reader)."""

    def __init__(self, raw) -> None:
        super().__init__()
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        self._start()

    def _start(self) -> None:
        self._frame = None  # the frame being decoded; None between frames
        self._input = b""  # bytes read past a frame's end: the next frame's start
        self._output = memoryview(b"")  # decoded, not yet read
        self._pos = 0  # decoded bytes read so far

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """As gzip's reader seeks: forward by decoding, back by decoding again from the
        file's start (a .json is sniffed, then read from its start)."""
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._pos + offset}.get(whence)
        if target is None or target < 0:
            raise io.UnsupportedOperation(f"zstd: cannot seek to {offset} from {whence}")
        if target < self._pos:
            self._raw.seek(0)
            self._start()
        while self._pos < target and self.readinto(memoryview(bytearray(
                min(target - self._pos, 1 << 20)))):
            pass
        return self._pos

    def readinto(self, buffer) -> int:
        while not self._output:
            if not self._decode_more():
                return 0
        n = min(len(buffer), len(self._output))
        buffer[:n] = self._output[:n]
        self._output = self._output[n:]
        self._pos += n
        return n

    def _decode_more(self) -> bool:
        """Decode the next bytes of the file; False at its end (after a whole frame)."""
        data = self._input or self._raw.read(READ_BYTES)
        self._input = b""
        if not data:
            if self._frame is not None:
                raise EOFError("zstd: the file ends inside a frame (it was cut off)")
            return False
        if self._frame is None:
            self._frame = self._decompressor.decompressobj(write_size=WRITE_BYTES)
        self._output = memoryview(self._frame.decompress(data))
        if self._frame.eof:  # the frame ended; what follows it starts the next
            self._input, self._frame = self._frame.unused_data, None
        return True

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_zstd(path: str | Path, mode: str = "rb") -> io.BufferedReader:
    """`path`'s decompressed bytes, as `gzip.open(path, "rb")` gives a .gz file's."""
    if mode != "rb":
        raise ValueError(f"zstd files are opened for reading bytes only, not {mode!r}")
    return io.BufferedReader(ZstdReader(open(path, "rb")))
