"""The paper's realness-by-context rule: values shown as examples are not anyone's data.

Step 3 of the digest's dataset refinement judges each candidate on its context ("test fixtures,
examples") as well as its format. An IP address, username, password or email written where the
text says it is an example (`e.g. '7.1.4.34'`, a doctest line, the lines under "Example usage:")
is a placeholder. The marker must be right before the value: "for example the problem resolver
8.8.4.4 answered" tells of a real address. Names and keys are not judged this way: an example may cite a real person, and
a real key pasted into an example is still a leak.
"""

from __future__ import annotations

import re

from kiln.data.pii.spans import Span

EXAMPLE_TYPES = frozenset({"IP_ADDRESS", "USERNAME", "PASSWORD", "EMAIL"})
# right before the span (at most MARKER_REACH words between): "e.g.", "ex:", "for example"...
EXAMPLE_MARKER = re.compile(
    r"(?:\be\.\s?g\.|\beg[.:]|\bex:|\bexamples?\b:?|\bfor instance\b|\bsuch as\b|\bsample\b)",
    re.IGNORECASE)
MARKER_REACH = 2  # "(ex: 'fe80::1' or '123:2:3:4:5:6:7:8')"; not "for example the resolver X"
_WORDY = re.compile(r"\w")  # a quote or bracket between marker and value is not a word
_WORD_RUN = re.compile(r"\S+")
MARKER_LEN = 16  # at least the longest EXAMPLE_MARKER match ("for instance")
DOCTEST = re.compile(r"[ \t]*(?:#[ \t]*)?(?:>>>|\.\.\.)[ \t]")
# a line that announces an example block below it: "Example usage:", "... in clear text). Eg:"
EXAMPLE_HEADING = re.compile(
    r"(?:\be\.\s?g\.?|\beg|\bexamples?(?:[ \t]+(?:usage|config(?:uration)?|session))?"
    r"|\bfor example|\bsample[ \t]+(?:usage|config(?:uration)?|output))[ \t]*:+[ \t]*$", re.IGNORECASE)
HEADING_REACH = 15  # lines: an example block is rarely longer before its values


def in_example(text: str, span: Span) -> bool:
    """A doctest line, an example marker right before the span on its line, or one of the
    HEADING_REACH lines above announcing an example block ("Example usage:", "Eg:")."""
    line_start = text.rfind("\n", 0, span.start) + 1
    if DOCTEST.match(text, line_start):
        return True
    reach = words_back(text, line_start, span.start, MARKER_REACH + 2, wordy=True)
    markers = list(EXAMPLE_MARKER.finditer(text, max(line_start, reach - MARKER_LEN), span.start))
    between = [w for w in text[markers[-1].end():span.start].split() if _WORDY.search(w)] if markers else []
    if markers and len(between) <= MARKER_REACH:
        return True
    return any(EXAMPLE_HEADING.search(line) for line in _lines_above(text, line_start))


def _lines_above(text: str, line_start: int) -> list[str]:
    """The HEADING_REACH lines before the one at `line_start`, found from it backwards (the
    text before it split whole was O(len) a span: a log of a few MB took minutes)."""
    if line_start == 0:
        return []
    start = end = line_start - 1  # the newline that ends the line above
    for _ in range(HEADING_REACH):
        start = text.rfind("\n", 0, start)
        if start < 0:
            break
    return text[start + 1:end].split("\n")


def words_back(text: str, line_start: int, end: int, words: int, wordy: bool = False) -> int:
    """Where the `words`-th whitespace-split word before `end` starts (with `wordy`: counting
    only words with a word character), or `line_start` if there are fewer. Rules about the
    last few words before a value read from here, not from the line's start: on a one-line
    JSON of 8000 emails, reading the whole line for each took a minute."""
    size = 256  # a window grown until it holds them (a regex, not a loop over characters)
    while True:
        lo = max(line_start, end - size)
        runs = list(_WORD_RUN.finditer(text, lo, end))
        if runs and runs[0].start() == lo > line_start and not text[lo - 1].isspace():
            runs = runs[1:]  # it runs on before the window: not whole
        starts = [m.start() for m in runs if not wordy or _WORDY.search(m.group()) is not None]
        if len(starts) >= words:
            return starts[-words]
        if lo == line_start:
            return line_start
        size *= 4


def drop_examples(text: str, spans: list[Span]) -> list[Span]:
    """The spans that are not example values (see `in_example`)."""
    return [s for s in spans if s.type not in EXAMPLE_TYPES or not in_example(text, s)]
