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
# "sample" is an example only as a value's label ("sample email:", `"sample":`), not as the
# thing handled: "send the sample to dagny.holm@…" kept a real address
SAMPLE_NOUN = r"[ \t]+(?:to|from|by|of|for|at|in|on|with|and|was|were|is|are|has|had)\b"
EXAMPLE_MARKER = re.compile(
    r"(?:\be\.\s?g\.|\beg[.:]|\bex:|\bexamples?\b:?|\bfor instance\b|\bsuch as\b"
    rf"|\bsample\b(?!{SAMPLE_NOUN}))",
    re.IGNORECASE)
MARKER_REACH = 2  # "(ex: 'fe80::1' or '123:2:3:4:5:6:7:8')"; not "for example the resolver X"
_WORDY = re.compile(r"\w")  # a quote or bracket between marker and value is not a word
# A word ends at a space and at what separates the items of a list or record: minified JSON
# (`{"sample":1,"users":["a@x.no","b@x.no",...]}`) has no space, and read as one word its
# line put every value within MARKER_REACH words of the `sample` at its start.
# CJK text's own punctuation (、。「」, full-width ，；（）) separates as well: it has no spaces.
WORD_SEPARATORS = ("\\s,;|&\"()\\[\\]{}<>"
                   "\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65")
_WORD_RUN = re.compile(f"[^{WORD_SEPARATORS}]+")
_WORD_CHAR = re.compile(f"[^{WORD_SEPARATORS}]")
# characters: a word further back than this is not "right before" a value (a marker 4 KB of
# unbroken text away introduces nothing)
MAX_LOOKBACK = 4096
MARKER_LEN = 16  # at least the longest EXAMPLE_MARKER match ("for instance")
DOCTEST = re.compile(r"[ \t]*(?:#[ \t]*)?(?:>>>|\.\.\.)[ \t]")
# a line that announces an example block below it: "Example usage:", "... in clear text). Eg:"
EXAMPLE_HEADING = re.compile(
    r"(?:\be\.\s?g\.?|\beg|\bexamples?(?:[ \t]+(?:usage|config(?:uration)?|session))?"
    r"|\bfor example|\bsample[ \t]+(?:usage|config(?:uration)?|output))[ \t]*:+[ \t]*$", re.IGNORECASE)
HEADING_REACH = 15  # lines: an example block is rarely longer before its values


HEADING_TAIL = 64  # characters: a heading's words and its colon end its line


def in_example(text: str, span: Span, headed: dict[int, bool] | None = None) -> bool:
    """A doctest line, an example marker right before the span on its line, or one of the
    HEADING_REACH lines above announcing an example block ("Example usage:", "Eg:").
    `headed` keeps the last answer per line start, for the many spans of one line."""
    line_start = text.rfind("\n", 0, span.start) + 1
    if DOCTEST.match(text, line_start):
        return True
    reach = words_back(text, line_start, span.start, MARKER_REACH + 2, wordy=True)
    markers = list(EXAMPLE_MARKER.finditer(text, max(line_start, reach - MARKER_LEN), span.start))
    between = [w for w in _WORD_RUN.findall(text, markers[-1].end(), span.start) if _WORDY.search(w)] \
        if markers else []
    if markers and len(between) <= MARKER_REACH:
        return True
    headed = {} if headed is None else headed
    if line_start not in headed:
        headed[line_start] = _under_heading(text, line_start)
    return headed[line_start]


def _under_heading(text: str, line_start: int) -> bool:
    """One of the HEADING_REACH lines above the one at `line_start` ends in an example
    heading. Read backwards from it, each line's end only: the lines above copied and searched
    whole for each span made a long line (minified JSON) above a line of many values O(len^2):
    4000 emails under a 170 KB line took a minute."""
    end = line_start - 1  # the newline that ends the line above
    for _ in range(HEADING_REACH):
        if end < 0:
            return False
        start = text.rfind("\n", 0, end) + 1
        # a CRLF line's `\r` is no part of it: `$` does not match before one, so no
        # heading of a Windows file counted
        line_end = end - 1 if end > start and text[end - 1] == "\r" else end
        tail = line_end
        while tail > start and text[tail - 1] in " \t:":
            tail -= 1
        if EXAMPLE_HEADING.search(text, max(start, tail - HEADING_TAIL), line_end):
            return True
        end = start - 1
    return False


def words_back(text: str, line_start: int, end: int, words: int, wordy: bool = False) -> int:
    """Where the `words`-th word (`_WORD_RUN`) before `end` starts (with `wordy`: counting
    only words with a word character), or `line_start` if there are fewer; at most
    MAX_LOOKBACK characters back. Rules about the last few words before a value read from
    here, not from the line's start: on a one-line JSON of 8000 emails, reading the whole
    line for each took a minute, and so did a line of CJK text (one word without spaces)."""
    size = 256  # a window grown until it holds them (a regex, not a loop over characters)
    while True:
        lo = max(line_start, end - size)
        runs = list(_WORD_RUN.finditer(text, lo, end))
        if runs and runs[0].start() == lo > line_start and _WORD_CHAR.match(text, lo - 1):
            runs = runs[1:]  # it runs on before the window: not whole
        starts = [m.start() for m in runs if not wordy or _WORDY.search(m.group()) is not None]
        if len(starts) >= words:
            return starts[-words]
        if lo == line_start or size >= MAX_LOOKBACK:
            return lo
        size *= 4


def drop_examples(text: str, spans: list[Span]) -> list[Span]:
    """The spans that are not example values (see `in_example`)."""
    headed: dict[int, bool] = {}
    return [s for s in spans if s.type not in EXAMPLE_TYPES or not in_example(text, s, headed)]
