"""Where each {...} group closes, as `read_group` reads it, found by one lazy left-to-right pass
per text: a run of unclosed groups (5,000 \\newcommand\\x{ took ~14 s) then costs one pass, not
one scan to the end of the text each."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

BRACE_OR_ESCAPE = re.compile(r"\\[\s\S]?|[{}]")


def _braces(text: str, starts: list[int], ends: list[int], i: int) -> Iterator[tuple[int, str]]:
    """(index, brace) of each { and } read from index `i` on, skipping what `read_group` skips:
    the character after a backslash, and the literal spans (`starts`, `ends`) starting after `i`."""
    k = bisect.bisect_left(starts, i + 1)
    skip = starts[k] if k < len(starts) else -1
    while True:
        if 0 <= skip <= i:
            i = max(i, ends[k])
            k = bisect.bisect_left(starts, i)
            skip = starts[k] if k < len(starts) else -1
            continue
        m = BRACE_OR_ESCAPE.search(text, i)
        if m is None:
            return
        if 0 <= skip <= m.start():
            i = skip
            continue
        i = m.end()
        if m.group() in "{}":
            yield m.start(), m.group()


class GroupEnds:
    """The } closing each { read from `start` on. The pass reads from a { (`start`) exactly as
    `read_group` would, so a { it reads has the same close as `read_group` finds; a { it skips
    (escaped, in a literal span) is no answer here (None from `end`)."""

    def __init__(self, text: str, starts: list[int], ends: list[int], start: int):
        self.start = start
        self.braces = _braces(text, starts, ends, start)
        self.read = start - 1  # index of the last brace read
        self.open: list[int] = []
        self.opened: set[int] = set()
        self.close: dict[int, int] = {}  # index of a { -> index of its }, or -1 once unclosed
        self.done = False

    def end(self, pos: int) -> int | None:
        """Index of the } closing the { at `pos` (>= start), -1 when none does, None when the
        pass did not read a { there."""
        while not self.done and (self.read < pos or (pos in self.opened and pos not in self.close)):
            if (brace := next(self.braces, None)) is None:
                self.done = True
                for at in self.open:
                    self.close[at] = -1
            else:
                self.read = brace[0]
                if brace[1] == "{":
                    self.open.append(brace[0])
                    self.opened.add(brace[0])
                elif self.open:
                    self.close[self.open.pop()] = brace[0]
        return self.close.get(pos)
