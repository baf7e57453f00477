"""Literal spans: the parts of a LaTeX text that TeX reads with other catcodes (\\verb, \\url,
inline code, verbatim-like environments), so a % in them is not a comment, a macro is not expanded
and a brace does not open a group; and, in the same left-to-right pass, the % comments.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import NamedTuple

# Spans whose content TeX reads literally, so a % inside is not a comment and a macro is not
# expanded: \verb<d>..<d> (one line, ASCII non-letter delimiter); \url, \nolinkurl and \path (the
# url package re-reads catcodes) with a {balanced} argument or \verb's delimiter form; \href's
# {URL}; \lstinline[opts]<d>..<d> or {..} (closed by the first }, as listings does);
# \mintinline and \mint (minted's one-line display) [opts]{lang}<d>..<d> or {balanced}; \Verb
# (fancyvrb; fvextra adds braces) *[opts]<d>..<d> or {balanced}; verbatim-like environments up to
# their exact \end{name}, the body starting after their arguments (`LITERAL_ENV_ARGS`); and, once
# declared by \MakeShortVerb{\|}, \DefineShortVerb or \lstMakeShortInline (until \DeleteShortVerb,
# \UndefineShortVerb, \lstDeleteShortInline), |..| on one line, as \verb. Runs of `\\` (line
# breaks) and `\%` (a percent sign) are matched and skipped, so a command or % counts only after an
# even run of backslashes (likewise `\|` is a control symbol, not a short verb). Each regex starts
# with one literal or character set, which lets the search skip plain text fast; the arguments are
# read in Python (`literal_spans`) with remembered searches, since a regex cannot match balanced
# braces and would rescan the rest of the line for each unclosed opener.
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
SHORT_DELIMITERS = CODE_DELIMITERS.replace("%", "")  # what \MakeShortVerb may make a delimiter
# Arguments read before a literal environment's body ('[' optional, '{' mandatory), as TeX does.
LITERAL_ENV_ARGS = {"Verbatim": "[", "Verbatim*": "[", "BVerbatim": "[", "LVerbatim": "[",
                    "lstlisting": "[", "minted": "[{", "filecontents": "[{", "filecontents*": "[{"}
_COMMAND = (
    r"(?P<cmd>(?P<verb>verb\*?)(?=[" + re.escape(VERB_DELIMITERS) + r"])"
    r"|(?P<url>url|nolinkurl|path|href)(?![a-zA-Z@])|(?P<code>lstinline|mintinline|mint|Verb)(?![a-zA-Z@])"
    r"|(?P<short>(?:Make|Define)ShortVerb|lstMakeShortInline"
    r"|(?P<unshort>(?:Delete|Undefine)ShortVerb|lstDeleteShortInline))(?![a-zA-Z@])"
    r"|begin\s*\{(?P<env>" + "|".join(re.escape(e) for e in LITERAL_ENVS) + r")\})"
)
LITERAL = re.compile(r"\\(?:\\(?:\\\\)*|" + _COMMAND + ")")
LITERAL_OR_COMMENT = re.compile(r"[%\\](?:(?<=%)(?P<pct>)|(?<=\\)(?:%|\\(?:\\\\)*|" + _COMMAND + "))")
# The short-verb argument: {\|}, \|, {|} or |, after \MakeShortVerb*, [options] and blanks.
SHORT_CHAR = re.compile(r"[ \t]*(?:\{[ \t]*\\?(?P<braced>[^\s{}])[ \t]*\}|\\?(?P<bare>[^\s{}]))")
# A literal environment's [options] (braces nested twice at most) and {argument}, read within
# ENV_ARGS_WINDOW characters so that unclosed ones stay linear.
ENV_OPTIONS = re.compile(r"[ \t]*\[(?:[^\[\]{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\]")
ENV_ARGUMENT = re.compile(r"[ \t]*\{[^{}\n%]*\}")
ENV_ARGS_WINDOW = 1000
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
    verbatim-like environment), "shortverb" (a \\MakeShortVerb-like declaration, after which the
    characters in `active` delimit short verbs), "verb" (\\verb or a short verb) or the command
    (``url``, ``lstinline``, ``Verb``...); its literal content is text[inner_start:inner_end] (a
    comment's is the whole span; an environment's is its body, after its arguments)."""

    start: int
    end: int
    kind: str
    inner_start: int
    inner_end: int
    active: str = ""


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
    if name == "Verb" and text.startswith("*", pos):
        pos += 1
    if (pos := scan.options(pos)) < 0:
        return None, m.end()
    if name in ("mintinline", "mint"):
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


def _env_body(text: str, env: str, pos: int) -> int:
    """Where the body of the literal environment whose name ends at `pos` starts: after its
    [options] and {argument} (`LITERAL_ENV_ARGS`), read within `ENV_ARGS_WINDOW` characters."""
    end = min(len(text), pos + ENV_ARGS_WINDOW)
    for shape in LITERAL_ENV_ARGS.get(env, ""):
        if m := (ENV_OPTIONS if shape == "[" else ENV_ARGUMENT).match(text, pos, end):
            pos = m.end()
        elif shape == "{":
            break
    return pos


def _short_verb(scan: _Scanner, m: re.Match, short: str) -> Span | None:
    """The \\MakeShortVerb-like declaration at `m` as a span whose `active` is the short-verb
    characters after it (`short` before it), or None when its argument is not a delimiter."""
    text, pos = scan.text, m.end()
    if text.startswith("*", pos):  # \MakeShortVerb*: visible spaces, the same delimiters
        pos += 1
    if (pos := scan.options(pos)) < 0:
        return None
    arg = SHORT_CHAR.match(text, pos)
    char = arg.group("braced") or arg.group("bare") if arg else None
    if not char or char not in SHORT_DELIMITERS:
        return None
    active = set(short) - {char} if m.group("unshort") else set(short) | {char}
    return Span(m.start(), arg.end(), "shortverb", arg.end(), arg.end(), "".join(sorted(active)))


@lru_cache(maxsize=64)
def _pattern(comments: bool, short: str) -> re.Pattern:
    """The search for literal spans (and comments when `comments`) while the characters of
    `short` delimit short verbs: each is then a span opener, unless a backslash precedes it."""
    if not short:
        return LITERAL_OR_COMMENT if comments else LITERAL
    chars = "".join(re.escape(c) for c in short)
    backslash = r"(?<=\\)(?:" + ("%|" if comments else "") + r"\\(?:\\\\)*|[" + chars + "]|" + _COMMAND + ")"
    opener = r"(?<=[" + chars + r"])(?P<sv>)"
    if comments:
        return re.compile(r"[%\\" + chars + r"](?:(?<=%)(?P<pct>)|" + backslash + "|" + opener + ")")
    return re.compile(r"[\\" + chars + r"](?:" + backslash + "|" + opener + ")")


def literal_spans(text: str, comments: bool = False, short: str = "") -> Iterator[Span]:
    """The literal spans of `text` (and its comments when `comments`), left to right; `short`:
    the short-verb characters already declared where `text` starts.

    An unclosed \\verb, \\url, \\lstinline... or environment is not a span (TeX would stop with
    an error). Linear time: the next delimiter / ``\\end{env}`` / closing brace found (or found
    missing) is remembered, so no stretch of text is searched twice for the same one.
    """
    pos, scan = 0, _Scanner(text)
    pattern = _pattern(comments, short)
    while (m := pattern.search(text, pos)) is not None:
        start, pos = m.span()
        if m.lastgroup is None:  # `\\` pairs, `\%` or a backslash then a short-verb character
            continue
        if m.lastgroup == "pct":
            pos = _comment_end(text, start)
            yield Span(start, pos, "%", start, pos)
        elif m.lastgroup == "sv":
            end = scan.delimited(start, text[start])
            if end >= 0:
                yield Span(start, end, "verb", start + 1, end - 1)
                pos = end
        elif m.group("verb"):
            end = scan.delimited(pos, text[pos])
            if end >= 0:
                yield Span(start, end, "verb", pos + 1, end - 1)
                pos = end
        elif env := m.group("env"):
            close = scan.find(f"\\end{{{env}}}", pos)
            if close >= 0:
                body = _env_body(text, env, pos)
                yield Span(start, close + len(env) + 6, "env", body if body <= close else pos, close)
                pos = close + len(env) + 6
        elif m.group("short"):
            span = _short_verb(scan, m, short)
            if span is not None:
                yield span
                pos = span.end
                if span.active != short:
                    short = span.active
                    pattern = _pattern(comments, short)
        else:
            span, pos = _command_span(scan, m)
            if span is not None:
                yield span
                pos = span.end


class LiteralSpans:
    """Where a text has \\verb, \\url, inline code, short verbs and verbatim-like spans (their
    content is not LaTeX); `spans` lists them, left to right. `short`: the short-verb characters
    declared where the text starts; `short_at(pos)`, those in force at `pos`."""

    def __init__(self, text: str, short: str = ""):
        self.spans = list(literal_spans(text, short=short)) if "\\" in text or short else []
        self.starts = [s.start for s in self.spans]
        self.ends = [s.end for s in self.spans]
        self.short = short
        self.changes = [s for s in self.spans if s.kind == "shortverb"]
        self.change_ends = [s.end for s in self.changes]

    def __contains__(self, pos: int) -> bool:
        k = bisect.bisect_right(self.starts, pos) - 1
        return k >= 0 and pos < self.ends[k]

    def short_at(self, pos: int) -> str:
        k = bisect.bisect_right(self.change_ends, pos) - 1
        return self.changes[k].active if k >= 0 else self.short


def short_verbs_after(text: str, short: str = "") -> str:
    """The short-verb characters declared at the end of `text` (`short` at its start): those of
    a preamble hold in the body."""
    if "ShortVerb" not in text and "ShortInline" not in text:
        return short
    return LiteralSpans(text, short).short_at(len(text))
