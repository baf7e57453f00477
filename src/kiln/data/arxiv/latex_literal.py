"""Literal spans: the parts of a LaTeX text that TeX reads with other catcodes (\\verb, \\url,
inline code, verbatim-like environments), so a % in them is not a comment, a macro is not expanded
and a brace does not open a group; and, in the same left-to-right pass, the % comments.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from typing import NamedTuple

# Spans whose content TeX reads literally, so a % inside is not a comment and a macro is not
# expanded: \verb<d>..<d> (one line, ASCII non-letter delimiter); \url, \nolinkurl and \path (the
# url package re-reads catcodes) with a {balanced} argument or \verb's delimiter form; \href's
# {URL}; \lstinline[opts]<d>..<d> or {..} (closed by the first }, as listings does);
# \mintinline[opts]{lang}<d>..<d> or {balanced}; verbatim-like environments up to their exact
# \end{name}. Runs of `\\` (line breaks) and `\%` (a percent sign) are matched and skipped, so a
# command or % counts only after an even run of backslashes. Each regex starts with one literal
# or character set, which lets the search skip plain text fast; the arguments are read in Python
# (`_spans`) with remembered searches, since a regex cannot match balanced braces and would rescan
# the rest of the line for each unclosed opener.
LITERAL_ENVS = (
    "verbatim", "verbatim*", "Verbatim", "Verbatim*", "BVerbatim", "LVerbatim", "lstlisting",
    "minted", "alltt", "comment", "filecontents", "filecontents*",
)
VERB_DELIMITERS = "!\"#$%&'()+,-./0123456789:;<=>?@[\\]^_`{|}~"  # ASCII, not a letter, * or space
# The delimiter forms of \url-like commands and inline code take fewer: a bare command is also
# met in definitions (``{\url}``, ``\def\url#1``, ``\let\url=``, ``\let\url\relax``), and
# TikZ has its own ``\path[options] (coord)``; a { starts the brace form instead.
URL_DELIMITERS = "".join(c for c in VERB_DELIMITERS if c not in "{}[]()\\#=%")
# \path is also a common user macro in math (``$\path_1$``, ``$\path'$``): only the delimiters
# seen with the url package's \path count.
PATH_DELIMITERS = '|!"'
CODE_DELIMITERS = "".join(c for c in VERB_DELIMITERS if c not in "{}\\#")
_COMMAND = (
    r"(?P<cmd>(?P<verb>verb\*?)(?=[" + re.escape(VERB_DELIMITERS) + r"])"
    r"|(?P<url>url|nolinkurl|path|href)(?![a-zA-Z@])|(?P<code>lstinline|mintinline)(?![a-zA-Z@])"
    r"|begin\s*\{(?P<env>" + "|".join(re.escape(e) for e in LITERAL_ENVS) + r")\})"
)
LITERAL = re.compile(r"\\(?:\\(?:\\\\)*|" + _COMMAND + ")")
LITERAL_OR_COMMENT = re.compile(r"[%\\](?:(?<=%)(?P<pct>)|(?<=\\)(?:%|\\(?:\\\\)*|" + _COMMAND + "))")
BLANKS = re.compile(r"\s*")
OPTIONS_STOP = re.compile(r"[\]\n%]")  # ends [options]: only a ] does; a newline or a % (comment) spoils it
LANGUAGE_STOP = re.compile(r"[{}\n%]")  # ends \mintinline's {language}: only a } does
BRACES = re.compile(r"[{}]")
FLAT_GROUP = re.compile(r"\{[^{}]*\}")
LINE_BLANKS = re.compile(r"[ \t]*")


def _comment_end(text: str, start: int) -> int:
    """End of the comment at `start`: TeX drops its line end and the next line's indent, but a
    blank next line still ends the paragraph, so then the line end is kept."""
    eol = text.find("\n", start)
    if eol < 0:
        return len(text)
    after = LINE_BLANKS.match(text, eol + 1).end()
    return eol if text.startswith(("\n", "\r\n"), after) else after


class Span(NamedTuple):
    """A comment or literal span: text[start:end]; `kind` is "%" (a comment), "env" (a
    verbatim-like environment) or the command (``verb``, ``url``, ``lstinline``...); its literal
    content is text[inner_start:inner_end] (a comment's is the whole span)."""

    start: int
    end: int
    kind: str
    inner_start: int
    inner_end: int


class _Braces:
    """Where each { after `start` closes, found by one lazy left-to-right pass: every brace counts
    (the url package reads \\{ as two characters), and the } closing a { does not depend on the
    text before it, so one pass answers every later question (unclosed openers stay linear)."""

    def __init__(self, text: str, start: int):
        self.start = start
        self.braces = BRACES.finditer(text, start)
        self.open: list[int] = []
        self.close: dict[int, int] = {}
        self.done = False

    def end(self, pos: int) -> int:
        """Index after the } that closes the { at `pos` (>= start), or -1 when none does."""
        while pos not in self.close and not self.done:
            if (m := next(self.braces, None)) is None:
                self.done = True
            elif m.group() == "{":
                self.open.append(m.start())
            elif self.open:
                self.close[self.open.pop()] = m.end()
        return self.close.get(pos, -1)


class _Scanner:
    """The arguments of literal commands, read with remembered searches: each search for a given
    needle or pattern comes at a position past the previous one (`_spans` resumes after what it
    read), so an answer at or after the new position still holds and no text is searched twice."""

    def __init__(self, text: str):
        self.text = text
        self.found: dict[str | re.Pattern, int] = {}
        self.braces: _Braces | None = None

    def find(self, needle: str | re.Pattern, pos: int) -> int:
        """text.find(needle, pos) or the start of pattern.search(text, pos); -1 when none."""
        at = self.found.get(needle, -2)
        if at == -1 or at >= pos:
            return at
        if isinstance(needle, str):
            at = self.text.find(needle, pos)
        else:
            at = m.start() if (m := needle.search(self.text, pos)) else -1
        self.found[needle] = at
        return at

    def on_line(self, close: int, pos: int) -> bool:
        """Whether `close` (>= 0) comes before the end of the line that `pos` is on."""
        eol = self.find("\n", pos)
        return close >= 0 and (eol < 0 or close < eol)

    def delimited(self, pos: int, close_char: str) -> int:
        """Index after `close_char` closing the argument whose delimiter is at `pos` (on the same
        line, as TeX requires of \\verb), or -1."""
        close = self.find(close_char, pos + 1)
        return close + 1 if self.on_line(close, pos + 1) else -1

    def balanced(self, pos: int, rejectable: bool = False) -> int:
        """Index after the } that balances the { at `pos`, or -1.

        A brace-free group is one regex match. Else, while no { has been found unclosed, the
        braces are counted up to the close (the span is then accepted and never read again);
        from an unclosed { on, and for a span the caller may still reject (`rejectable`: its
        text is read again), a `_Braces` pass answers, so nothing is counted twice.
        """
        if m := FLAT_GROUP.match(self.text, pos):
            return m.end()
        if self.braces is None and not rejectable:
            depth = 0
            for m in BRACES.finditer(self.text, pos):
                depth += 1 if m.group() == "{" else -1
                if depth == 0:
                    return m.end()
        if self.braces is None or pos < self.braces.start:
            self.braces = _Braces(self.text, pos)
        return self.braces.end(pos)

    def options(self, pos: int) -> int:
        """After `pos` and blanks, the index after an [options] closed on its line with no % in
        it (TeX reads them as ordinary text), or `pos` when there are none; -1 when spoilt."""
        at = LINE_BLANKS.match(self.text, pos).end()
        if not self.text.startswith("[", at):
            return pos
        close = self.find(OPTIONS_STOP, at + 1)
        return close + 1 if close >= 0 and self.text[close] == "]" else -1


def _command_span(scan: _Scanner, m: re.Match) -> tuple[Span | None, int]:
    """The literal span of the \\url-like or inline-code command at `m` (None when its argument is
    not closed), and where the search goes on (past options and {language}, which have no %)."""
    text, start, pos = scan.text, m.start(), m.end()
    if name := m.group("url"):
        at = BLANKS.match(text, pos).end()
        if text.startswith("{", at):
            end = scan.balanced(at)
            return (Span(start, end, name, at + 1, end - 1) if end >= 0 else None), pos
        delimiters = "" if name == "href" else PATH_DELIMITERS if name == "path" else URL_DELIMITERS
        if pos < len(text) and text[pos] in delimiters:
            end = scan.delimited(pos, text[pos])
            return (Span(start, end, name, pos + 1, end - 1) if end >= 0 else None), pos
        return None, pos
    name = m.group("code")
    if (pos := scan.options(pos)) < 0:
        return None, m.end()
    if name == "mintinline":
        at = LINE_BLANKS.match(text, pos).end()
        if not text.startswith("{", at):
            return None, pos
        close = scan.find(LANGUAGE_STOP, at + 1)
        if close < 0 or text[close] != "}":
            return None, pos
        pos = close + 1
    elif text.startswith("{", at := LINE_BLANKS.match(text, pos).end()):
        pos = at
    if pos >= len(text):
        return None, pos
    delimiter = text[pos]
    if delimiter == "{":
        if name == "lstinline":
            end = scan.delimited(pos, "}")
        else:
            end = scan.balanced(pos, rejectable=True)
            end = end if end >= 0 and scan.on_line(end - 1, pos + 1) else -1
    elif delimiter in CODE_DELIMITERS:
        end = scan.delimited(pos, delimiter)
    else:
        return None, pos
    return (Span(start, end, name, pos + 1, end - 1) if end >= 0 else None), pos


def _spans(text: str, pattern: re.Pattern) -> Iterator[Span]:
    """The comments and literal spans of `text`, left to right.

    An unclosed \\verb, \\url, \\lstinline... or environment is not a span (TeX would stop with
    an error). Linear time: the next delimiter / ``\\end{env}`` / closing brace found (or found
    missing) is remembered, so no stretch of text is searched twice for the same one.
    """
    pos, scan = 0, _Scanner(text)
    while (m := pattern.search(text, pos)) is not None:
        start, pos = m.span()
        if m.lastgroup is None:  # `\\` pairs or `\%`
            continue
        if m.lastgroup == "pct":
            pos = _comment_end(text, start)
            yield Span(start, pos, "%", start, pos)
        elif m.group("verb"):
            end = scan.delimited(pos, text[pos])
            if end >= 0:
                yield Span(start, end, "verb", pos + 1, end - 1)
                pos = end
        elif env := m.group("env"):
            close = scan.find(f"\\end{{{env}}}", pos)
            if close >= 0:
                yield Span(start, close + len(env) + 6, "env", pos, close)
                pos = close + len(env) + 6
        else:
            span, pos = _command_span(scan, m)
            if span is not None:
                yield span
                pos = span.end


class LiteralSpans:
    """Where a text has \\verb, \\url, inline code and verbatim-like spans (their content is not
    LaTeX); `spans` lists them, left to right."""

    def __init__(self, text: str):
        self.spans = list(_spans(text, LITERAL)) if "\\" in text else []
        self.starts = [s.start for s in self.spans]
        self.ends = [s.end for s in self.spans]

    def __contains__(self, pos: int) -> bool:
        k = bisect.bisect_right(self.starts, pos) - 1
        return k >= 0 and pos < self.ends[k]
