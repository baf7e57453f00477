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
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from typing import BinaryIO

from kiln.data.json_records import (
    BOM,
    JSON_LINES_SNIFF,
    MAX_WRAPPER_DEPTH,
    RECORD_KEYS,
    RECORD_SNIFF_BYTES,
    ListFacts,
    TooLarge,
    _object,
    judge_lines,
)

# a .json of up to this many bytes (decompressed) is parsed whole, once, as it always was
WHOLE_JSON_BYTES = 4 << 20
# bytes asked of the file (or its decompressor) at a time
READ_BYTES = 1 << 20
# a first line of up to this many bytes is held to tell JSON lines; a longer one is walked
LINE_BYTES = 1 << 20
# a value parsed this near the end of what is read may go on (a number's digits) or be cut
# (`-Infinity`, a `\uXXXX` escape): it is parsed again with more of the file
MARGIN = 16
WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
LINE_WS = re.compile(r"[ \t\r]*")
_DECODER = json.JSONDecoder()
_scan_once = _DECODER.scan_once
SEPARATOR = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_scanstring = json.decoder.scanstring

OpenFile = Callable[[], BinaryIO]


class JsonStreamError(ValueError):
    """Where the file stops being JSON, as `json.loads` of the whole would say (`msg`,
    `pos`, `lineno`); `recursion`: nested too deep (a RecursionError there)."""

    def __init__(self, msg: str, pos: int = 0, lineno: int = 1, at: str = "",
                 after_comma: bool = False, recursion: bool = False):
        super().__init__(f"{msg}: line {lineno} (char {pos})")
        self.msg, self.pos, self.lineno = msg, pos, lineno
        self.at, self.after_comma, self.recursion = at, after_comma, recursion

    @property
    def may_be_jsonc(self) -> bool:
        """As kiln.data.jsonc.may_be_jsonc: broken at a `/`, or a `]` / `}` after a comma."""
        return self.at == "/" or (self.at in ("]", "}") and self.after_comma)


class Cursor:
    """The file's text, decoded a chunk at a time, and a place in it (`buf[pos]`). Text before
    `pos` is dropped as more is read; what it held that errors ask for (its newlines, its last
    non-blank character) is kept. A `UnicodeDecodeError` ends the text where the valid UTF-8
    ends (`error`), as decoding the whole fails there. A value held past `limit` characters
    (the memory budget) raises TooLarge, as the file parsed whole was refused."""

    def __init__(self, f: BinaryIO, skip: int = 0, sig: bool = True, limit: int | None = None):
        self.f = f
        self.limit = limit
        if skip:
            f.seek(skip)
        self.buf = ""
        self.pos = 0
        self.base = 0  # characters dropped before buf
        self.lines = 0  # newlines dropped
        self.prev = ""  # the last non-blank character dropped
        self.eof = False
        self.error: UnicodeDecodeError | None = None
        self.chars = 0  # characters decoded
        self.trailing = 0  # of them, the whitespace at the end so far
        self._sig = sig  # a UTF-8 byte-order mark to leave out (`utf-8-sig`)
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def fill(self, want: int = 1) -> bool:
        """Read at least `want` more characters (fewer at the end); False if none came."""
        if self.eof:
            return False
        self._drop()
        got = 0
        texts = [self.buf]  # joined once: a long value is not copied once a chunk
        while got < want and not self.eof:
            raw = self.f.read(READ_BYTES)
            end = not raw
            if self._sig:
                while len(raw) < len(BOM) and (more := self.f.read(READ_BYTES)):
                    raw += more
                end = not raw
                raw, self._sig = raw.removeprefix(BOM), False
            try:
                text = self._decoder.decode(raw, final=end)
            except UnicodeDecodeError as e:  # e.object: the bytes held back and these
                text = e.object[:e.start].decode("utf-8")
                self.error = e
                end = True
            self.eof = end
            if text:
                texts.append(text)
                got += len(text)
                self.chars += len(text)
                kept = text.rstrip()
                self.trailing = len(text) - len(kept) if kept else self.trailing + len(text)
        if got:
            self.buf = "".join(texts)
        return got > 0

    def _drop(self) -> None:
        if not self.pos:
            return
        self.lines += self.buf.count("\n", 0, self.pos)
        self.prev = self._before(self.pos)
        self.base += self.pos
        self.buf = self.buf[self.pos:]
        self.pos = 0

    def _before(self, idx: int) -> str:
        """The last non-blank character before buf[idx]."""
        head = self.buf[:idx].rstrip()  # in C: a run of megabytes of blanks is common enough
        return head[-1] if head else self.prev

    def drain(self) -> None:
        """Read the rest, keeping none of it: a decode error after a JSON error is the
        error (the whole is decoded before it is parsed), and `chars` is the whole's."""
        self.pos = len(self.buf)
        while self.fill():
            self.pos = len(self.buf)

    def peek(self) -> str:
        while self.pos >= len(self.buf):
            if not self.fill():
                return ""
        return self.buf[self.pos]

    def skip(self, pattern: re.Pattern[str] = WS) -> None:
        while True:
            self.pos = pattern.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.fill():
                return

    def line(self) -> int:
        """Newlines before `pos`."""
        return self.lines + self.buf.count("\n", 0, self.pos)

    def fail(self, msg: str, idx: int | None = None) -> None:
        idx = self.pos if idx is None else idx
        raise JsonStreamError(msg, self.base + idx,
                              self.lines + self.buf.count("\n", 0, idx) + 1,
                              self.buf[idx:idx + 1], self._before(idx) == ",")

    def _again(self, at: int, unterminated: bool = False) -> bool:
        """Whether a parse that ended (or failed) at `at` may differ with more of the file:
        read more (as much again as the value so far, so a long one is parsed a few times,
        not once a chunk)."""
        if self.eof or not (unterminated or at > len(self.buf) - MARGIN):
            return False
        if self.limit is not None and len(self.buf) - self.pos > self.limit:
            raise TooLarge
        self.fill(max(READ_BYTES, len(self.buf) - self.pos))
        return True

    def value(self) -> object:
        """The JSON value at `pos`, parsed by `json`, `pos` after it."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self._again(e.pos, e.msg.startswith("Unterminated string")):
                    continue
                self.fail(e.msg, e.pos)
            except RecursionError:
                raise JsonStreamError("nested too deep", self.base + self.pos,
                                      recursion=True) from None
            if self._again(end):
                continue
            self.pos = end
            return value

    def next_value(self) -> object:
        """`value`, parsed at once where it ends well before the end of what is read (the
        usual case: a record), else as `value` parses it (more read, or the error)."""
        buf, pos = self.buf, self.pos
        try:
            value, end = _scan_once(buf, pos)
        except (StopIteration, json.JSONDecodeError, RecursionError):
            return self.value()
        if end > len(buf) - MARGIN and not self.eof:
            return self.value()
        self.pos = end
        return value

    def key(self) -> str:
        """The string at `pos` (a `"`), `pos` after it."""
        while True:
            try:
                key, end = _scanstring(self.buf, self.pos + 1, True)
            except json.JSONDecodeError as e:
                if self._again(e.pos, e.msg.startswith("Unterminated string")):
                    continue
                self.fail(e.msg, e.pos)
            self.pos = end
            return key


class Members(dict):
    """A walked object's members by key (a later duplicate's value in the first one's place,
    as `json` makes a dict): ListFacts, Members (a wrapper walked into) or Other."""

    def __init__(self, ordinal: int = 0):
        super().__init__()
        self.ordinal = ordinal  # its place among its parent's members


class Other:
    """A member that is neither a list nor an object walked into (parsed, not kept): one
    shared instance (`OTHER`), so an object of many members holds little for each."""

    __slots__ = ()


OTHER = Other()
# what the walk holds for a member of an object it walks (a dict slot, a node), besides its
# key, charged against the memory budget: an object of millions of small members (records
# keyed by their ids) is refused, or parsed whole where it fits, not walked until the kernel
# kills the run
MEMBER_BYTES = 200


Event = tuple[tuple[int, ...], int, object]


class Walk:
    """The walk of a file's value: `run` yields (path, i, entry) for each entry of each
    list above the records (path: the members' ordinals down to the list, () for a list at
    the top; i = -1, entry None, where the list ends); `top` is then the ListFacts of a list,
    the Members of an object, or None for any other value. `line`: the value is one object
    alone on a line (`first_line_object`'s test), not the file."""

    def __init__(self, cursor: Cursor, text_field: str, line: bool = False):
        self.c = cursor
        self.text_field = text_field
        self.line = line
        self.top: ListFacts | Members | None = None
        self.held = 0  # bytes the walked objects' members hold (MEMBER_BYTES and their keys)

    def run(self) -> Iterator[Event]:
        c = self.c
        if self.line:
            c.skip(LINE_WS)
            start = c.line()
            if c.peek() != "{":
                c.fail("Expecting an object alone on its line")
        else:
            if c.peek() == "\ufeff":  # a second one: json.loads refuses it
                c.fail("Unexpected UTF-8 BOM (decode using utf-8-sig)")
            c.skip()
        ch = c.peek()
        if ch == "[":
            self.top = ListFacts()
            yield from self._list((), self.top)
        elif ch == "{":
            self.top = Members()
            yield from self._object((), self.top, 1)
        else:
            c.value()
        if self.line:
            c.skip(LINE_WS)
            ch = c.peek()
            if c.line() != start or ch not in ("\n", "") or (not ch and c.error is not None):
                c.fail("Expecting an object alone on its line")
        else:
            c.skip()
            if c.peek():
                c.fail("Extra data")

    def _list(self, path: tuple[int, ...], facts: ListFacts) -> Iterator[Event]:
        c = self.c
        c.pos += 1
        c.skip()
        if c.peek() == "]":
            c.pos += 1
            yield path, -1, None
            return
        i = 0
        while True:
            value = c.next_value()
            facts.add(value, self.text_field)
            yield path, i, value
            i += 1
            m = SEPARATOR.match(c.buf, c.pos)  # the usual case, at once: `, ` and more to read
            if m is not None and m.end() < len(c.buf):
                c.pos = m.end()
                continue
            c.skip()
            ch = c.peek()
            if ch == "]":
                c.pos += 1
                yield path, -1, None
                return
            if ch != ",":
                c.fail("Expecting ',' delimiter")
            c.pos += 1
            c.skip()

    def _object(self, path: tuple[int, ...], members: Members, depth: int) -> Iterator[Event]:
        """The members of an object `depth` deep (the file's: 1); a list is walked entry by
        entry, an object walked into where `find_record_lists` may look into it."""
        c = self.c
        c.pos += 1
        c.skip()
        ch = c.peek()
        if ch == "}":
            c.pos += 1
            return
        ordinal = 0
        while True:
            if ch != '"':
                c.fail("Expecting property name enclosed in double quotes")
            key = c.key()
            c.skip()
            if c.peek() != ":":
                c.fail("Expecting ':' delimiter")
            c.pos += 1
            c.skip()
            ch = c.peek()
            here = (*path, ordinal)
            if not ordinal:
                first = key
            if ch == "[":
                node: ListFacts | Members | Other = ListFacts(ordinal)
                yield from self._list(here, node)
            elif ch == "{" and depth < MAX_WRAPPER_DEPTH and (key.lower() in RECORD_KEYS or (
                    depth == 1 and key == first)):  # depth 1: the only key (so far)?
                node = Members(ordinal)
                yield from self._object(here, node, depth + 1)
            else:
                c.value()
                node = OTHER
            self.held += MEMBER_BYTES + len(key)
            if c.limit is not None and self.held > c.limit:
                raise TooLarge
            members[key] = node
            ordinal += 1
            c.skip()
            ch = c.peek()
            if ch == "}":
                c.pos += 1
                return
            if ch != ",":
                c.fail("Expecting ',' delimiter")
            c.pos += 1
            c.skip()
            ch = c.peek()


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
        c = Cursor(f, limit=limit)
        walk = Walk(c, text_field)
        try:
            for _ in walk.run():
                pass
        except JsonStreamError as e:
            failed = e
        else:
            failed = None
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
        while size <= limit and (chunk := f.read(min(READ_BYTES, limit + 1 - size))):
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
            while not line.endswith(b"\n") and (line := f.readline(READ_BYTES)):
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
