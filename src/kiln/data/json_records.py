"""Where the records of a `.json` file are, so the reader never trains on a dataset's markup.

A `.json` dataset comes in several shapes: a list of objects, JSON lines saved under a `.json`
name, or an object that wraps the list (`{"data": [...]}`, `{"version": 1, "rows": [...]}`).
Read as one text document, any of them is braces, quotes and keys, and a cut-off download
of one is the same. Other JSON in a source tree (a `package.json`, a `tsconfig.json` with
comments) is text like the code beside it; these tests tell the two apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO

from kiln.data.json_depth import MAX_JSON_DEPTH, deeper_than

BOM = b"\xef\xbb\xbf"
# A .json file that does not parse and has the text field as a key this near its start
# holds records (cut off), not prose or code.
RECORD_SNIFF_BYTES = 8192
# Keys under which datasets keep their list of records (and the splits of a dataset dict):
# a list of objects under one of them is records even beside other keys (`version`).
RECORD_KEYS = frozenset(
    "data rows records examples items instances samples documents docs entries "
    "train training validation valid dev test".split())
# A .json parsed whole (its bytes, their text, the parsed values and the documents made of
# them) took 3.6x its size in the reader (a list of 8 kB records of prose with some
# non-Latin-1 characters: benchmarks/read_memory.py; a text outside Latin-1 decodes to 2-4
# bytes a character), so one over a quarter of the free memory is read in a stream
# (kiln.data.json_stream), and what must still be held whole there (one record, JSONC, a
# value too large) is refused (`TooLarge`) rather than read until the kernel kills the run.
JSON_MEMORY_FACTOR = 4
MAX_WRAPPER_DEPTH = 3  # `{"data": {"train": [...]}}` is two deep
# `{"key": [{` at the start: a wrapper of records, even when cut off or damaged later on
WRAPPER_START = re.compile(rb'\{\s*"(?:[^"\\]|\\.)*"\s*:\s*\[\s*\{')


def text_key_pattern(text_field: str) -> re.Pattern[bytes]:
    """The text field as a JSON key (`"content":`), as raw bytes: spelled as the file may
    spell it, its quotes and backslashes escaped, other characters as they are in UTF-8."""
    key = json.dumps(text_field, ensure_ascii=False).encode("utf-8", "backslashreplace")
    return re.compile(re.escape(key) + rb"\s*:")


class ListFacts:
    """What the record rules ask of a list, gathered an entry at a time, so a list streamed
    from a file too large to parse whole (kiln.data.json_stream) is judged as the parsed
    list is. `ordinal`: its place among its object's members (the streamed reader's)."""

    __slots__ = ("entries", "all_objects", "with_text", "with_string", "ordinal")

    def __init__(self, ordinal: int = 0):
        self.entries = 0
        self.all_objects = True
        self.with_text = False  # an entry (an object) has the text field
        self.with_string = False  # an entry (an object) has a string value
        self.ordinal = ordinal

    def add(self, entry: object, text_field: str) -> None:
        self.entries += 1
        if not isinstance(entry, dict):
            self.all_objects = False
            return
        if not self.with_text and text_field in entry:
            self.with_text = True
        if not self.with_string:
            self.with_string = any(isinstance(v, str) for v in entry.values())

    @property
    def records(self) -> bool:
        """A list of records: every entry an object, or some entry with the text field (the
        others are then counted, not the list read as markup)."""
        return self.entries > 0 and (self.all_objects or self.with_text)


def list_facts(value: list, text_field: str) -> ListFacts:
    facts = ListFacts()
    for entry in value:
        facts.add(entry, text_field)
    return facts


def holds_records(value: object, text_field: str) -> bool:
    """A list of records (`ListFacts.records`)."""
    return isinstance(value, list) and list_facts(value, text_field).records


def record_lists(data: dict, text_field: str) -> list[tuple[str, list]]:
    """The lists of records an object wraps, by key path (`data`, `data.train`).

    A list of objects is records when an entry has the text field, or when it sits under a
    usual records key (`RECORD_KEYS`) or is the only value of the file's object, and some
    entry has a string to read (the text under another name). So a config that holds a
    list of objects among its settings (a launch.json's `configurations` beside `version`),
    or a JSON schema fragment (`{"allOf": [{...}]}`: objects of objects), stays text. An
    object under a records key, or the file object's only value, is looked into the same
    way (there, only records keys and the text field make a list records)."""
    def facts(value: object) -> ListFacts | None:
        return list_facts(value, text_field) if isinstance(value, list) else None

    return [(where, value) for where, _, value in find_record_lists(data, facts)]


def find_record_lists(data: Mapping, facts: Callable[[object], ListFacts | None],
                      path: str = "", depth: int = 1) -> Iterator[tuple[str, tuple, object]]:
    """`record_lists` over `data` (a parsed object, or a streamed one's summary: `facts`
    tells a list's ListFacts, None for any other value): (key path, keys, value)."""
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        wrapped = str(key).lower() in RECORD_KEYS or (depth == 1 and len(data) == 1)
        found = facts(value)
        if found is not None and found.records:
            if found.with_text or (wrapped and found.with_string):
                yield where, (key,), value
        elif isinstance(value, Mapping) and wrapped and depth < MAX_WRAPPER_DEPTH:
            for inner, keys, lst in find_record_lists(value, facts, where, depth + 1):
                yield inner, (key, *keys), lst


class TooLarge(Exception):
    """A bounded read found more than its limit (`read_at_most`, a line of `first_line_object`)."""


def read_at_most(f: BinaryIO, limit: int | None) -> bytes:
    """The rest of `f`, or TooLarge past `limit` bytes, read in chunks (`f.read(limit)` would
    allocate all of `limit` at once) and no further than the chunk that passes it."""
    if limit is None:
        return f.read()
    chunks, size = [], 0
    while chunk := f.read(READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise TooLarge
    return b"".join(chunks)


READ_CHUNK = 16 << 20


def first_line_object(f: BinaryIO, max_line: int | None = None) -> tuple[dict | None, bool]:
    """The first non-blank line of `f` (a file at its start) if it is a JSON object on its
    own, and whether the file is JSON lines. Valid JSON has nothing after a complete object,
    so a first-line object followed by another line is JSON lines, unless that line is a
    comment (`//`, `/*`: a JSONC file, read whole). A first line that is damaged (cut off,
    not UTF-8) is JSON lines too where the next lines (up to `JSON_LINES_SNIFF`) are each an
    object on their own: a pretty-printed object's lines never all are. Reads a few lines,
    not the file, and not even the first of a file that does not start with `{` (a list on
    one line is the file); a line over `max_line` bytes (an object on one line too large to
    parse) raises TooLarge."""
    start = f.read(RECORD_SNIFF_BYTES).removeprefix(BOM).lstrip()
    f.seek(0)
    if start[:1] not in (b"{", b""):
        return None, False
    return judge_lines(_lines(f, JSON_LINES_SNIFF + 1, max_line))


def judge_lines(lines: list, as_object: Callable[[object], object] | None = None,
                ) -> tuple[object, bool]:
    """`first_line_object`'s answer from the file's first non-blank lines: each bytes, or
    (kiln.data.json_stream) a line too long to hold, with its first non-blank byte (`lead`)
    and `as_object` telling whether it is an object on its own."""
    as_object = as_object or _object
    if not lines:
        return None, False
    first = as_object(lines[0])
    if first is not None:
        following = lines[1] if len(lines) > 1 else None
        if following is not None and _lead(following) == b"/":
            return None, False  # a comment: JSONC, not JSON lines
        return first, following is not None
    return None, len(lines) > 1 and all(as_object(line) is not None for line in lines[1:])


def _lead(line: object) -> bytes:
    return line.lstrip()[:1] if isinstance(line, bytes) else line.lead


# a damaged first line is JSON lines where this many lines after it are objects (or all the
# lines the file has after it, when it has fewer)
JSON_LINES_SNIFF = 2


def _lines(f: BinaryIO, count: int, max_line: int | None = None) -> list[bytes]:
    """The first `count` non-blank lines of `f` (the BOM off the first); TooLarge for a line
    over `max_line` bytes, read no further."""
    found: list[bytes] = []
    n = 0
    while line := f.readline(-1 if max_line is None else max_line + 1):
        if max_line is not None and len(line) > max_line:
            raise TooLarge
        n += 1
        if n == 1:
            line = line.removeprefix(BOM)
        if line.strip():
            found.append(line)
            if len(found) == count:
                break
    return found


def _object(line: bytes) -> dict | None:
    """`line` as a JSON object on its own, or None (not UTF-8, not JSON, not an object)."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if deeper_than(line, MAX_JSON_DEPTH):  # judged with the file, as the stream judges it
        return None
    return value if isinstance(value, dict) else None


def damaged_records(raw: bytes, text_key: re.Pattern[bytes], error: Exception) -> bool:
    """Whether `raw`, a .json file that failed to parse with `error`, starts as records do
    (`starts_as_records`, with whether the parse was cut off)."""
    return starts_as_records(raw[:RECORD_SNIFF_BYTES], text_key, cut_off(error))


def starts_as_records(head: bytes, text_key: re.Pattern[bytes], cut: bool) -> bool:
    """Whether a .json file that failed to parse, starting with `head` (its first
    RECORD_SNIFF_BYTES), starts as records do: a list of objects (`[{`), an object that
    wraps one (`{"data": [{`), a record with the text field (`text_key`) near the start, or
    an object cut off at its end (`cut`: a truncated download). An object broken in its
    middle (a tsconfig.json's comments) is not."""
    head = head[:RECORD_SNIFF_BYTES].removeprefix(BOM).lstrip()
    if not head.startswith((b"{", b"[")):
        return False
    after = head[1:].lstrip()[:1]
    if head.startswith(b"["):
        return after == b"{" or bool(text_key.search(head))
    return after == b'"' and bool(text_key.search(head) or WRAPPER_START.match(head) or cut)


def cut_off(error: Exception) -> bool:
    """Whether the JSON that failed with `error` ends before it is complete: it parsed up to
    its end, where more was due (also when the cut falls inside a character of several
    bytes)."""
    if isinstance(error, UnicodeDecodeError):
        return error.reason == "unexpected end of data"  # only ever at the end
    if isinstance(error, json.JSONDecodeError):  # an unterminated string runs to the end
        return error.msg.startswith("Unterminated string") or error.pos >= len(error.doc.rstrip())
    return False
