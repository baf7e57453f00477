"""The text of a large `.json`, decoded a chunk at a time, and a place in it: the one piece
of the streamed read (kiln.data.json_stream) that touches the file's bytes.

Why its own: the walk above the records and the two passes over the file only ask it for
the next character, a key or a value; how the text is read, dropped behind, and parsed by
`json`'s own decoder (so a value is what `json.loads` makes of it, and an error is its
error at its place) is this one idea.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import BinaryIO, NoReturn

from kiln.data.json_depth import MAX_JSON_DEPTH, NestedTooDeep, deeper_than
from kiln.data.json_records import BOM, TooLarge

# bytes asked of the file (or its decompressor) at a time
READ_BYTES = 1 << 20
# a value parsed this near the end of what is read may go on (a number's digits) or be cut
# (`-Infinity`, a `\uXXXX` escape): it is parsed again with more of the file
MARGIN = 16
WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_DECODER = json.JSONDecoder()
_scan_once = _DECODER.scan_once
_scanstring = json.decoder.scanstring

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
    (the memory budget) raises TooLarge, as the file parsed whole was refused. `defer_depth`:
    a value nested past MAX_JSON_DEPTH is noted (`too_deep`, where the first starts) and the
    walk goes on, as `json.loads` of the whole goes on to a later error, which it reports
    instead (the depth is checked once the whole has parsed)."""

    def __init__(self, f: BinaryIO, skip: int = 0, sig: bool = True, limit: int | None = None,
                 defer_depth: bool = False):
        self.f = f
        self.limit = limit
        self.defer_depth = defer_depth
        self.too_deep: int | None = None
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

    def value(self, above: int = 0) -> object:
        """The JSON value at `pos`, parsed by `json`, `pos` after it; `above`: the lists and
        objects it is in (MAX_JSON_DEPTH counts them, as for the whole file)."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self._again(e.pos, e.msg.startswith("Unterminated string")):
                    continue
                self.fail(e.msg, e.pos)
            except RecursionError:
                self._too_deep()
            if self._again(end):
                continue
            self._check_depth(end, above)
            self.pos = end
            return value

    def next_value(self, above: int = 0) -> object:
        """`value`, parsed at once where it ends well before the end of what is read (the
        usual case: a record), else as `value` parses it (more read, or the error)."""
        buf, pos = self.buf, self.pos
        try:
            value, end = _scan_once(buf, pos)
        except (StopIteration, json.JSONDecodeError, RecursionError):
            return self.value(above)
        if end > len(buf) - MARGIN and not self.eof:
            return self.value(above)
        self._check_depth(end, above)
        self.pos = end
        return value

    def _check_depth(self, end: int, above: int) -> None:
        if deeper_than(self.buf, MAX_JSON_DEPTH - above, self.pos, end):
            if not self.defer_depth:
                self._too_deep()
            if self.too_deep is None:
                self.too_deep = self.base + self.pos

    def depth_error(self) -> JsonStreamError | None:
        """The error of the first value nested too deep that `defer_depth` let pass."""
        if self.too_deep is None:
            return None
        return JsonStreamError(str(NestedTooDeep()), self.too_deep, recursion=True)

    def _too_deep(self) -> NoReturn:
        raise JsonStreamError(str(NestedTooDeep()), self.base + self.pos,
                              recursion=True) from None

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

