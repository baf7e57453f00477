"""A `.json` file too large to parse whole, read as a stream of its values, twice.

Why: parsed whole, a .json took 3.6x its size in the reader (its bytes, their text, the
parsed values), so one over a quarter of the free memory was refused. What a large .json
holds is a list of records, at its top or wrapped (`{"data": [...]}`, `{"data": {"train":
[...]}}`); a file over `WHOLE_JSON_BYTES` (or its memory budget) is read an entry at a time:

1. `first_line` tells JSON lines saved as .json from the rest (as `first_line_object` does,
   without holding a line too long to), and `scan` walks the whole file, checking it as
   `json.loads` would (the same error at the same place: a cut-off or damaged file is
   judged as before), keeping only what the record rules ask (`ListFacts` of each list,
   the keys of each wrapper object: `find_record_lists` decides from them as from the
   parsed value);
2. `entries` walks it again, yielding the entries of the one list of records chosen.

The walk is a small scanner of the containers above the records (whitespace, `[`, `,`, `]`,
`{`, keys, `:`); every value below them is parsed by `json`'s own decoder (`raw_decode`), so
a record is the value `json.loads` makes of it. Memory is a read chunk and a record; a value
that is no list of records (a long string, an object below the wrapper depth, a list in a
list) is held while it is parsed, as a record is.

The text is read by kiln.data.json_cursor and walked by kiln.data.json_walk; this module
holds the two passes and the sniffing of the first lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import BinaryIO

from kiln.data import json_cursor
from kiln.data.json_cursor import Cursor, JsonStreamError
from kiln.data.json_records import (
    BOM,
    JSON_LINES_SNIFF,
    RECORD_SNIFF_BYTES,
    ListFacts,
    _object,
    judge_lines,
)
from kiln.data.json_walk import Members, Walk

# a .json of up to this many bytes (decompressed) is parsed whole, once, as it always was
WHOLE_JSON_BYTES = 4 << 20
# a first line of up to this many bytes is held to tell JSON lines; a longer one is walked
LINE_BYTES = 1 << 20

OpenFile = Callable[[], BinaryIO]


class Scan:
    """What `scan` found: `top` (Walk.top) where the file is JSON, else `error`
    (JsonStreamError or UnicodeDecodeError) and whether it was `cut` off (`cut_off`);
    `head`: its first bytes (`starts_as_records`); `start`: where the object alone on its
    first line starts (a byte offset), None for the whole file."""

    def __init__(self, top: ListFacts | Members | None = None, error: Exception | None = None,
                 cut: bool = False, head: bytes = b"", start: int | None = None):
        self.top, self.error, self.cut, self.head, self.start = top, error, cut, head, start


def scan(open_file: OpenFile, text_field: str, limit: int | None = None) -> Scan:
    """Walk the whole file once (see the module); TooLarge for a value held past `limit`
    characters."""
    with open_file() as f:
        head = f.read(RECORD_SNIFF_BYTES)
    with open_file() as f:
        c = Cursor(f, limit=limit, defer_depth=True)  # a later JSON error is the error
        walk = Walk(c, text_field)
        try:
            for _ in walk.run():
                pass
        except JsonStreamError as e:
            failed = e
        else:
            failed = c.depth_error()
        c.drain()
    if c.error is not None:
        return Scan(error=c.error, cut=c.error.reason == "unexpected end of data", head=head)
    if failed is not None:
        cut = not failed.recursion and (failed.msg.startswith("Unterminated string")
                                        or failed.pos >= c.chars - c.trailing)
        return Scan(error=failed, cut=cut, head=head)
    return Scan(walk.top, head=head)


def line_object(open_file: OpenFile, offset: int, text_field: str,
                limit: int | None = None) -> Scan | None:
    """The walk of the line at byte `offset`, where it is one object alone on its line (as
    `json.loads` of that line would find), else None."""
    with open_file() as f:
        walk = Walk(Cursor(f, skip=offset, sig=False, limit=limit), text_field, line=True)
        try:
            for _ in walk.run():
                pass
        except JsonStreamError:
            return None
    return Scan(walk.top, start=offset)


def holds_at_most(f: BinaryIO, limit: int) -> bool:
    """Whether `f` (a decompressor) holds at most `limit` bytes, read a chunk at a time no
    further than past it. Cut off before that: True (parsed whole, it is `unreadable`)."""
    size = 0
    try:
        while size <= limit and (chunk := f.read(min(json_cursor.READ_BYTES, limit + 1 - size))):
            size += len(chunk)
    except EOFError:
        return True
    return size <= limit


class LongLine:
    """A line over LINE_BYTES, not held: where it starts and its first non-blank byte."""

    def __init__(self, offset: int, lead: bytes):
        self.offset, self.lead = offset, lead


def first_line(open_file: OpenFile, text_field: str, max_line: int | None = None,
               limit: int | None = None) -> tuple[dict | Scan | None, bool]:
    """`first_line_object` of the file, a line over `max_line` (LINE_BYTES) bytes walked
    rather than held: its first value a dict (a line held), a Scan (a long line that is one
    object alone), or None; and whether the file is JSON lines."""
    max_line = LINE_BYTES if max_line is None else max_line
    with open_file() as f:
        start = f.read(RECORD_SNIFF_BYTES).removeprefix(BOM).lstrip()
        if start[:1] not in (b"{", b""):
            return None, False
        f.seek(0)
        lines = _line_heads(f, JSON_LINES_SNIFF + 1, max_line)

    def as_object(line: bytes | LongLine) -> dict | Scan | None:
        if isinstance(line, bytes):
            return _object(line)
        return line_object(open_file, line.offset, text_field, limit)

    return judge_lines(lines, as_object)


def _line_heads(f: BinaryIO, count: int, max_line: int) -> list[bytes | LongLine]:
    """The first `count` non-blank lines (json_records._lines), those over `max_line` bytes
    as a LongLine."""
    found: list[bytes | LongLine] = []
    offset = 0
    if f.read(len(BOM)) == BOM:  # off the first line (whatever `max_line`: not cut in it)
        offset = len(BOM)
    else:
        f.seek(0)
    while line := f.readline(max_line + 1):
        start = offset
        offset += len(line)
        long = len(line) > max_line and not line.endswith(b"\n")
        if long:  # read on to its end, a chunk at a time
            lead = _lead(line)
            while not line.endswith(b"\n") and (line := f.readline(json_cursor.READ_BYTES)):
                offset += len(line)
                lead = lead or _lead(line)
            if lead:
                found.append(LongLine(start, lead))
        elif line.strip():
            found.append(line)
        if len(found) == count:
            break
    return found


_NON_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # what bytes.strip() keeps


def _lead(piece: bytes) -> bytes:
    """The first non-blank byte of `piece` (b"" if none), without copying it."""
    m = _NON_BLANK.search(piece)
    return piece[m.start():m.start() + 1] if m else b""


def entries(open_file: OpenFile, text_field: str, route: tuple[int, ...],
            start: int | None = None, limit: int | None = None) -> Iterator[tuple[int, object]]:
    """The entries (index, value) of the list at `route` (its members' ordinals; () for the
    file's list), walked again; `start`: the offset of an object alone on its line. The
    file changed since its scan, so that it no longer parses, raises JsonStreamError."""
    with open_file() as f:
        walk = Walk(Cursor(f, skip=start or 0, sig=start is None, limit=limit), text_field,
                    line=start is not None)
        for path, i, value in walk.run():
            if path == route:
                if i < 0:
                    return
                yield i, value
