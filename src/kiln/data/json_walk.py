"""The walk of a large `.json`'s containers above its records: whitespace, `[`, `,`, `]`,
`{`, keys, `:`, with every value below them parsed by the cursor (kiln.data.json_cursor).

Why its own: both passes of the streamed read (kiln.data.json_stream: `scan`, then
`entries`) walk the file the same way; this is that walk, and what it keeps of the
containers (`ListFacts` of each list, the `Members` of each wrapper object) for
`find_record_lists` to decide from as from the parsed value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kiln.data.json_cursor import Cursor
from kiln.data.json_records import MAX_WRAPPER_DEPTH, RECORD_KEYS, ListFacts, TooLarge

LINE_WS = re.compile(r"[ \t\r]*")
SEPARATOR = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


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
            value = c.next_value(len(path) + 1)  # in the list and the objects above
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
                c.value(depth)
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

