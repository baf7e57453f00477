"""Where each {...} group closes, found by one lazy left-to-right pass per text: a run of
unclosed groups (5,000 \\newcommand\\x{ took ~14 s) then costs one pass, not one scan to the end
of the text each. The pass reads a brace iterator: `read_braces` (as `read_group` reads, past
escapes and literal spans) or every brace (the url package's reading, `latex_literal`)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

BRACE_OR_ESCAPE = re.compile(r"\\[\s\S]?|[{}]")
BRACES = re.compile(r"[{}]")
ESCAPED_OPEN = "\\{"  # a brace kind: a { read as part of an escape (see `GroupEnds`)


def read_braces(text: str, starts: list[int], ends: list[int], i: int) -> Iterator[tuple[int, str]]:
    """(index, kind) of each { and } read from index `i` on, skipping what `read_group` skips: the
    character after a backslash, and the literal spans (`starts`, `ends`) starting after `i`. An
    escaped { is yielded too, as `ESCAPED_OPEN` (a \\def's parameter text may end in one)."""
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
        brace = m.group()
        if brace in "{}":
            yield m.start(), brace
        elif brace == ESCAPED_OPEN:
            yield m.start() + 1, ESCAPED_OPEN


def every_brace(text: str, i: int) -> Iterator[tuple[int, str]]:
    """(index, brace) of every { and } from index `i` on, escaped or not."""
    for m in BRACES.finditer(text, i):
        yield m.start(), m.group()


class GroupEnds:
    """The } closing each { read from `start` on (the first brace `braces` yields): a stack of
    open braces, fed lazily, so the questions about a run of unclosed groups share one pass.

    A { of kind `ESCAPED_OPEN` opens nothing in the pass, but a reader started on it (as
    `read_group` is on a \\def's ``\\{``) reads it as a {, and the rest exactly as the pass does:
    it closes at the first } that leaves the pass's stack lower than at that {."""

    def __init__(self, braces: Iterator[tuple[int, str]], start: int):
        self.start = start
        self.braces = braces
        self.read = start - 1  # index of the last brace read
        self.open: list[int] = []
        self.escaped: list[tuple[int, int]] = []  # (index, stack height there) of each open `\{`
        self.opened: set[int] = set()
        self.close: dict[int, int] = {}  # index of a { -> index of its }, or -1 once unclosed
        self.done = False

    def end(self, pos: int) -> int | None:
        """Index of the } closing the { at `pos` (>= start), -1 when none does, None when the
        pass read no { there (one in a literal span the pass skipped)."""
        while not self.done and (self.read < pos or (pos in self.opened and pos not in self.close)):
            if (brace := next(self.braces, None)) is None:
                self.done = True
                for at in self.open:
                    self.close[at] = -1
                for at, _ in self.escaped:
                    self.close[at] = -1
                continue
            at, kind = brace
            self.read = at
            if kind == "{":
                self.open.append(at)
                self.opened.add(at)
            elif kind == ESCAPED_OPEN:
                self.escaped.append((at, len(self.open)))
                self.opened.add(at)
            else:
                while self.escaped and self.escaped[-1][1] == len(self.open):
                    self.close[self.escaped.pop()[0]] = at
                if self.open:
                    self.close[self.open.pop()] = at
        return self.close.get(pos)
