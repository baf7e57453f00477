"""How deep a `.json` may nest its lists and objects: one limit for every way it is read.

Why: `json` parses a nesting by recursion, so each reader was stopped by Python's recursion
limit less the frames above it: the whole parse at ~988 levels, the stream (its walk adds
frames) at ~985, and either elsewhere under an executor's deeper stack. A file between the
two read as records one way and was skipped the other. `MAX_JSON_DEPTH` is far above any
record's nesting and far below where the recursion limit stops a parse; both readers skip
a file deeper than it as damaged records (or read it as text), naming it and the limit. A
`.json` with comments (JSONC, `kiln.data.jsonc`) is held to it too, judged without them.
"""

from __future__ import annotations

import re

import numpy as np

MAX_JSON_DEPTH = 512
_KEPT = b'[]{}"'
_DROPPED = bytes(b for b in range(256) if b not in _KEPT)
_STRING = re.compile(rb'"[^"]*"')
_OPENS = np.frombuffer(b"[{", np.uint8)


# where a skip example says a file was nested too deep (kiln.data.skip_examples.where)
TOO_DEEP = ("nested_deeper_than", MAX_JSON_DEPTH)


class NestedTooDeep(ValueError):
    """A `.json` that nests lists and objects deeper than MAX_JSON_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_JSON_DEPTH} levels")


def deeper_than(text: str | bytes, limit: int, start: int = 0, end: int | None = None) -> bool:
    """Whether the JSON `text[start:end]` (valid JSON: its strings closed) nests lists and
    objects more than `limit` deep, brackets in strings not counted: by its brackets and
    quotes alone, escaped backslashes and then escaped quotes dropped first (a few ms a MB; a
    text holding no more opening brackets than `limit`, a record, at once)."""
    end = len(text) if end is None else end
    opens = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if text.count(opens[0], start, end) + text.count(opens[1], start, end) <= limit:
        return False
    if isinstance(text, str):
        raw = text[start:end].encode("utf-8", "surrogatepass")
    else:
        raw = text[start:end]
    # UTF-8 has no ASCII byte inside a character of several: the bytes hold the same marks
    if b"\\" in raw:  # (a search for one byte is the quickest)
        for escaped in (b"\\\\", b'\\"'):
            if escaped in raw:
                raw = raw.replace(escaped, b"")
    marks = raw.translate(None, _DROPPED)
    if marks.count(b"[") + marks.count(b"{") <= limit:
        return False
    steps = np.frombuffer(_STRING.sub(b"", marks), np.uint8)
    depth = np.cumsum(np.where(np.isin(steps, _OPENS), 1, -1))
    return bool(depth.max(initial=0) > limit)
