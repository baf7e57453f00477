"""A text file (`.txt`, plain or compressed) too large to hold, read in bounded chunks.

Why: a text file is one document, read whole and then cut into parts
(kiln.data.long_documents); a 500 MB one peaked at 1 GB (its bytes and its text), so a
5-20 GB book dump ran out of memory. A file of up to `WHOLE_TEXT_BYTES` is still read whole,
once; a larger one is read twice, chunk by chunk, and never held:

1. `scan_text` checks all of it, as a file read whole is checked before any of it is kept:
   a NUL byte anywhere makes it `binary`, one invalid UTF-8 sequence `non_utf8`, damage to
   its compression `unreadable` (none of it kept), and it counts its characters and lines
   (the cut-off line of a truncated download, the warning's length);
2. `decoded_chunks` decodes it again, for `split_text_stream` to cut into the same parts,
   ids and `part_of` as the whole text would give.

Memory is a chunk, its text and a part or two, whatever the file's size.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

# bytes asked of the file (or its decompressor) at a time
READ_BYTES = 1 << 20
# a file of up to this many bytes is read whole, in one pass (at most ~6x this in memory:
# its bytes, their join and its text); a larger one is over MAX_DOCUMENT_CHARS (at most 4
# bytes a character), so it is read as parts either way
WHOLE_TEXT_BYTES = 4 << 20

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def read_head(f: BinaryIO, limit: int | None = None) -> tuple[list[bytes], bool, bool]:
    """The file's first chunks, until it ends or more than `limit` (`WHOLE_TEXT_BYTES`) bytes
    are read; whether it ended there, and whether it was cut off (EOFError: what came before
    is kept). One decoder read each (`read1`), so a cut loses none of what was decoded before
    it."""
    limit = WHOLE_TEXT_BYTES if limit is None else limit
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = f.read1(READ_BYTES)
            if not chunk:
                return chunks, True, False
            chunks.append(chunk)
            size += len(chunk)
    except EOFError:
        return chunks, True, True
    return chunks, False, False


def raw_chunks(f: BinaryIO) -> Iterator[bytes]:
    """The file's bytes a decoder read at a time; the first chunk holds at least two bytes
    where the file does (its byte-order mark). A cut raises EOFError after what came before."""
    first = b""
    try:
        while len(first) < 2 and (chunk := f.read1(READ_BYTES)):
            first += chunk
    except EOFError:
        if first:
            yield first
        raise
    if first:
        yield first
    while chunk := f.read1(READ_BYTES):
        yield chunk


def _decoder(first: bytes) -> codecs.IncrementalDecoder:
    """As a file read whole is decoded: UTF-16 after its byte-order mark, else UTF-8 (a
    leading UTF-8 byte-order mark is not text either)."""
    return codecs.getincrementaldecoder(
        "utf-16" if first.startswith(UTF16_BOMS) else "utf-8-sig")()


@dataclass
class TextScan:
    """What a whole read would have found, in the order it is checked."""

    nul_byte: bool = False  # not UTF-16: binary, whatever else it holds
    non_utf8: bool = False
    non_utf8_line: int | None = None  # the line of the first invalid UTF-8 byte
    nul_char: bool = False  # once decoded: UTF-32 (FF FE 00 00), binary that starts like UTF-16
    cut: bool = False  # the file ends inside its compression (a truncated download)
    chars: int = 0
    newlines: int = 0
    blank: bool = True  # nothing but whitespace

    @property
    def skip(self) -> str | None:
        """Why none of it is read (as `SourceReader._read_text` decides), or None."""
        if self.nul_byte:
            return "binary"
        if self.non_utf8:
            return "non_utf8"
        return "binary" if self.nul_char else None


def scan_text(open_file: Callable[[], BinaryIO]) -> TextScan:
    """Check the whole file (see the module), decoding it chunk by chunk. Damage other than a
    cut (a gzip CRC, an lzma error) is raised, as reading it whole raises it."""
    scan = TextScan()
    decoder = None
    utf16 = False
    with open_file() as f:
        try:
            for chunk in raw_chunks(f):
                if decoder is None:
                    decoder = _decoder(chunk)
                    utf16 = chunk.startswith(UTF16_BOMS)
                if not utf16 and b"\x00" in chunk:
                    scan.nul_byte = True  # read on: damage after it still makes it unreadable
                if not (scan.nul_byte or scan.non_utf8):
                    _scan_text(scan, decoder, chunk, utf16)
        except EOFError:
            scan.cut = True
    if decoder is not None and not (scan.nul_byte or scan.non_utf8 or scan.cut):
        _scan_text(scan, decoder, b"", utf16, final=True)
    return scan


def _scan_text(scan: TextScan, decoder: codecs.IncrementalDecoder, chunk: bytes, utf16: bool,
               final: bool = False) -> None:
    try:
        text = decoder.decode(chunk, final=final)
    except UnicodeDecodeError as e:  # e.object: the bytes decoded (held ones + this chunk)
        scan.non_utf8 = True
        if not utf16:
            scan.non_utf8_line = scan.newlines + e.object[:e.start].count(b"\n") + 1
        return
    scan.nul_char = scan.nul_char or "\x00" in text
    scan.chars += len(text)
    scan.newlines += text.count("\n")
    scan.blank = scan.blank and not text.strip()


def decoded_chunks(open_file: Callable[[], BinaryIO], cut: bool) -> Iterator[str]:
    """The file's text, a chunk at a time, as `scan_text` found it (`cut`: up to where it was
    cut off, its last character left out if that was cut too). A file changed since its scan
    so that it no longer decodes raises ValueError (`unreadable`)."""
    decoder = None
    with open_file() as f:
        try:
            for chunk in raw_chunks(f):
                if decoder is None:
                    decoder = _decoder(chunk)
                if text := decoder.decode(chunk):
                    yield text
        except EOFError:
            if not cut:
                raise
            return
    if decoder is not None and not cut and (text := decoder.decode(b"", final=True)):
        yield text
