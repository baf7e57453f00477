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

from kiln.data.arxiv.latex_declared import (
    DECLARATION_TAILS,
    OPTIONS,
    ROLE_LATEX,
    Declared,
    command_table,
    declare,
    env_table,
)
from kiln.data.arxiv.latex_groups import BRACES, GroupEnds, every_brace, read_braces

# Spans whose content TeX reads literally, so a % inside is not a comment and a macro is not
# expanded: \verb<d>..<d> (one line, ASCII non-letter delimiter); \url, \nolinkurl and \path (the
# url package re-reads catcodes) with a {balanced} argument or \verb's delimiter form; \href's
# {URL}; \lstinline[opts]<d>..<d> or {..} (closed by the first }, as listings does);
# \mintinline and \mint (minted's one-line display) [opts]{lang}<d>..<d> or {balanced}; \Verb
# (fancyvrb; fvextra adds braces) *[opts]<d>..<d> or {balanced}; verbatim-like environments up to
# their exact \end{name}, the body starting after their arguments (`latex_declared.LITERAL_ENVS`,
# and those a declaration such as \lstnewenvironment or \excludecomment adds); the commands made
# by \newmint, \newmintinline (as \mint, \mintinline without {lang}) and \newmintedfile ([opts]
# {file}); and, once declared by \MakeShortVerb{\|}, \DefineShortVerb or \lstMakeShortInline
# (until \DeleteShortVerb, \UndefineShortVerb, \lstDeleteShortInline), |..| on one line, as
# \verb. Declarations are spans too, each carrying the `Declared` state after it. Runs of `\\`
# (line breaks) and `\%` (a percent sign) are matched and skipped, so a command or % counts only
# after an even run of backslashes (likewise `\|` is a control symbol, not a short verb). Each
# regex starts with one literal or character set, which lets the search skip plain text fast; the
# arguments are read in Python (`literal_spans`) with remembered searches, since a regex cannot
# match balanced braces and would rescan the rest of the line for each unclosed opener.
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
# The short-verb argument: {\|}, \|, {|} or |, after \MakeShortVerb*, [options] and blanks.
SHORT_CHAR = re.compile(r"[ \t]*(?:\{[ \t]*\\?(?P<braced>[^\s{}])[ \t]*\}|\\?(?P<bare>[^\s{}]))")
# A literal environment's [options] (`latex_declared.OPTIONS`: braces nested twice at most) and
# {argument}, after blanks, read within ENV_ARGS_WINDOW characters so that unclosed ones stay linear.
ENV_ARGUMENT = re.compile(r"\{[^{}\n%]*\}")
ENV_ARGS_WINDOW = 1000
BLANKS = re.compile(r"\s*")
OPTIONS_STOP = re.compile(r"[\]\n%]")  # ends [options]: only a ] does; a newline or a % (comment) spoils it
LANGUAGE_STOP = re.compile(r"[{}\n%]")  # ends \mintinline's {language}: only a } does
FLAT_GROUP = re.compile(r"\{[^{}]*\}")
LINE_BLANKS = re.compile(r"[ \t]*")
NO_DECLARATIONS = Declared()
# The commands that open literal spans or change the declarations, by the regex group they match in.
URL_COMMANDS = ("url", "nolinkurl", "path", "href")
CODE_COMMANDS = ("lstinline", "mintinline", "mint", "Verb")
SHORT_ON = ("MakeShortVerb", "DefineShortVerb", "lstMakeShortInline")
SHORT_OFF = ("DeleteShortVerb", "UndefineShortVerb", "lstDeleteShortInline")
COMMAND_NAMES = ("verb", "begin", *URL_COMMANDS, *CODE_COMMANDS, *SHORT_ON, *SHORT_OFF, *DECLARATION_TAILS)
MAX_STATES = 256


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
    verbatim-like environment), "shortverb" (a \\MakeShortVerb-like declaration), "verb" (\\verb
    or a short verb), the command (``url``, ``lstinline``, ``Verb``, or a declaration such as
    ``lstnewenvironment``) or, for a command made by \\newmint & co., the kind of span it opens
    (``mint``, ``mintinline``, ``mintedfile``); its literal content is text[inner_start:inner_end]
    (a comment's is the whole span; an environment's is its body, after its arguments). A
    declaration's `declared` is the state after it."""

    start: int
    end: int
    kind: str
    inner_start: int
    inner_end: int
    declared: Declared | None = None


class _Scanner:
    """The arguments of literal commands, read with remembered searches: each search for a given
    needle or pattern comes at a position past the previous one (`_spans` resumes after what it
    read), so an answer at or after the new position still holds and no text is searched twice."""

    def __init__(self, text: str):
        self.text = text
        self.found: dict[str | re.Pattern, int] = {}
        self.braces: GroupEnds | None = None  # every brace counts (see `balanced`)

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
        text is read again), a `GroupEnds` pass over every brace answers (the url package reads
        \\{ as two characters; the } closing a { does not depend on the text before it, so one
        pass answers every later question), so nothing is counted twice.
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
            self.braces = GroupEnds(every_brace(self.text, pos), pos)
        close = self.braces.end(pos)
        return close + 1 if close is not None and close >= 0 else -1

    def options(self, pos: int) -> int:
        """After `pos` and blanks, the index after an [options] closed on its line with no % in
        it (TeX reads them as ordinary text), or `pos` when there are none; -1 when spoilt."""
        at = LINE_BLANKS.match(self.text, pos).end()
        if not self.text.startswith("[", at):
            return pos
        close = self.find(OPTIONS_STOP, at + 1)
        return close + 1 if close >= 0 and self.text[close] == "]" else -1


def _command_span(scan: _Scanner, m: re.Match, declared: Declared) -> tuple[Span | None, int]:
    """The literal span of the \\url-like or inline-code command at `m` (None when its argument is
    not closed), and where the search goes on (past options and {language}, which have no %)."""
    text, start, pos = scan.text, m.start(), m.end()
    what = m.lastgroup
    if what == "made":  # by \newmint & co.: as \mint or \mintinline, without {language}
        return _made_span(scan, m, command_table(declared.commands)[m.group("made")])
    if what == "url":
        name = m.group("url")
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
    return _code_argument(scan, start, pos, name)


def _made_span(scan: _Scanner, m: re.Match, kind: str) -> tuple[Span | None, int]:
    """The span of a command made by \\newmint (`kind` "mint"), \\newmintinline ("mintinline"):
    [options] then the code, as \\mint's; or \\newmintedfile ("mintedfile"): [options]{file}."""
    text, pos = scan.text, m.end()
    if (pos := scan.options(pos)) < 0:
        return None, m.end()
    if kind != "mintedfile":
        return _code_argument(scan, m.start(), pos, kind)
    at = BLANKS.match(text, pos).end()
    end = scan.balanced(at) if text.startswith("{", at) else -1
    return (Span(m.start(), end, kind, at + 1, end - 1) if end >= 0 else None), pos


def _code_argument(scan: _Scanner, start: int, pos: int, name: str) -> tuple[Span | None, int]:
    """The inline-code command `name` at `start` whose code starts at `pos` (after blanks, a {
    or a delimiter) as a span, or None when it is not closed; and where the search goes on."""
    text = scan.text
    if text.startswith("{", at := LINE_BLANKS.match(text, pos).end()):
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


def _env_body(text: str, args: str, pos: int) -> int:
    """Where the body of the literal environment whose name ends at `pos` starts: after its
    arguments `args` ('[' [options], '{' {argument}), read within `ENV_ARGS_WINDOW` characters."""
    end = min(len(text), pos + ENV_ARGS_WINDOW)
    for shape in args:
        at = LINE_BLANKS.match(text, pos, end).end()
        if m := (OPTIONS if shape == "[" else ENV_ARGUMENT).match(text, at, end):
            pos = m.end()
        elif shape == "{":
            break
    return pos


def _short_verb(scan: _Scanner, m: re.Match, declared: Declared) -> Span | None:
    """The \\MakeShortVerb-like declaration at `m` as a span whose `declared` has the short-verb
    characters after it, or None when its argument is not a delimiter."""
    text, pos = scan.text, m.end()
    if text.startswith("*", pos):  # \MakeShortVerb*: visible spaces, the same delimiters
        pos += 1
    if (pos := scan.options(pos)) < 0:
        return None
    arg = SHORT_CHAR.match(text, pos)
    char = arg.group("braced") or arg.group("bare") if arg else None
    if not char or char not in SHORT_DELIMITERS:
        return None
    short = set(declared.short)
    short = short - {char} if m.group("unshort") else short | {char}
    after = declared._replace(short="".join(sorted(short)))
    return Span(m.start(), arg.end(), "shortverb", arg.end(), arg.end(), after)


def _alternation(names) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


@lru_cache(maxsize=64)
def _pattern(comments: bool, declared: Declared) -> re.Pattern:
    """The search for literal spans (and comments when `comments`) under `declared`: its
    verbatim-like environments and made commands open spans, and so do its short-verb
    characters, unless a backslash precedes one."""
    envs = [name for name, (role, _) in env_table(declared.envs).items() if role != ROLE_LATEX]
    made_names = [name for name, _ in declared.commands]
    made = f"(?P<made>{_alternation(made_names)})(?![a-zA-Z@])|" if made_names else ""
    initials = "".join(sorted({name[0] for name in (*COMMAND_NAMES, *made_names)}))
    command = (  # the lookahead fails most commands (\frac, \cite...) at their first letter
        r"(?=[" + re.escape(initials) + r"])(?:" + made
        + r"(?P<verb>verb\*?)(?=[" + re.escape(VERB_DELIMITERS) + r"])"
        r"|(?P<url>" + _alternation(URL_COMMANDS) + r")(?![a-zA-Z@])"
        r"|(?P<code>" + _alternation(CODE_COMMANDS) + r")(?![a-zA-Z@])"
        r"|(?P<short>" + _alternation(SHORT_ON) + "|(?P<unshort>" + _alternation(SHORT_OFF) + r"))(?![a-zA-Z@])"
        r"|(?P<declare>" + _alternation(DECLARATION_TAILS) + r")(?![a-zA-Z@])"
        r"|begin\s*\{(?P<env>" + _alternation(envs) + r")\})"
    )
    chars = "".join(re.escape(c) for c in declared.short)
    # After a backslash: % (when comments count), a run of backslashes, a short-verb character (\| is
    # no short verb) or a command.
    escaped = ("%|" if comments else "") + r"\\(?:\\\\)*|" + (f"[{chars}]|" if chars else "")
    branches = [r"(?<=\\)(?:" + escaped + command + ")"]
    if comments:
        branches.insert(0, r"(?<=%)(?P<pct>)")
    if chars:
        branches.append(r"(?<=[" + chars + r"])(?P<sv>)")
    return re.compile("[" + ("%" if comments else "") + r"\\" + chars + "](?:" + "|".join(branches) + ")")


def literal_spans(text: str, comments: bool = False, declared: Declared = NO_DECLARATIONS) -> Iterator[Span]:
    """The literal spans of `text` (and its comments when `comments`), left to right; `declared`:
    the declarations (short verbs, verbatim-like environments...) in force where `text` starts.
    Past `MAX_STATES` distinct states (each a regex to compile), a declaration that would make a
    new one is ignored.

    An unclosed \\verb, \\url, \\lstinline... or environment is not a span (TeX would stop with
    an error). Linear time: the next delimiter / ``\\end{env}`` / closing brace found (or found
    missing) is remembered, so no stretch of text is searched twice for the same one.
    """
    pos, scan, seen = 0, _Scanner(text), {declared}
    pattern = _pattern(comments, declared)
    while (m := pattern.search(text, pos)) is not None:
        start, pos = m.span()
        what = m.lastgroup  # the outermost named group that matched (one per alternative)
        if what is None:  # `\\` pairs, `\%` or a backslash then a short-verb character
            continue
        if what == "pct":
            pos = _comment_end(text, start)
            yield Span(start, pos, "%", start, pos)
        elif what == "sv":
            end = scan.delimited(start, text[start])
            if end >= 0:
                yield Span(start, end, "verb", start + 1, end - 1)
                pos = end
        elif what == "verb":
            end = scan.delimited(pos, text[pos])
            if end >= 0:
                yield Span(start, end, "verb", pos + 1, end - 1)
                pos = end
        elif what == "env":
            env = m.group("env")
            close = scan.find(f"\\end{{{env}}}", pos)
            if close >= 0:
                body = _env_body(text, declared.env(env)[1], pos)
                yield Span(start, close + len(env) + 6, "env", body if body <= close else pos, close)
                pos = close + len(env) + 6
        elif what in ("short", "declare"):
            span = _short_verb(scan, m, declared) if what == "short" else _declaration(text, m, declared)
            if span is not None and (span.declared in seen or len(seen) < MAX_STATES):
                yield span
                pos = span.end
                if span.declared != declared:
                    declared = span.declared
                    seen.add(declared)
                    pattern = _pattern(comments, declared)
        else:
            span, pos = _command_span(scan, m, declared)
            if span is not None:
                yield span
                pos = span.end


def _declaration(text: str, m: re.Match, declared: Declared) -> Span | None:
    """The declaration at `m` (\\lstnewenvironment{name}, \\excludecomment{name}...) as a span up
    to the arguments that `latex_declared.declare` reads, with the state after it."""
    read = declare(text, m.group("declare"), m.end(), declared)
    return Span(m.start(), read[1], m.group("declare"), read[1], read[1], read[0]) if read else None


class LiteralSpans:
    """Where a text has \\verb, \\url, inline code, short verbs and verbatim-like spans (their
    content is not LaTeX); `spans` lists them, left to right. `declared`: the declarations in
    force where the text starts; `declared_at(pos)`, those in force at `pos`."""

    def __init__(self, text: str, declared: Declared = NO_DECLARATIONS):
        self.text = text
        self.spans = list(literal_spans(text, declared=declared)) if "\\" in text or declared.short else []
        self.starts = [s.start for s in self.spans]
        self.ends = [s.end for s in self.spans]
        self.declared = declared
        self.changes = [s for s in self.spans if s.declared is not None]
        self.change_ends = [s.end for s in self.changes]
        self.found: dict[str, tuple[int, int]] = {}  # char -> (position asked, answer), for `find`
        self.groups: GroupEnds | None = None  # for `group_end`
        self.bracket_ends: dict[int, int] = {}  # index of a [ -> of its ], or -1: `read_bracket`'s

    def __contains__(self, pos: int) -> bool:
        k = bisect.bisect_right(self.starts, pos) - 1
        return k >= 0 and pos < self.ends[k]

    def declared_at(self, pos: int) -> Declared:
        k = bisect.bisect_right(self.change_ends, pos) - 1
        return self.changes[k].declared if k >= 0 else self.declared

    @property
    def declared_after(self) -> Declared:
        """The declarations in force at the end of the text: a preamble's (or a local .sty file's)
        hold in the body."""
        return self.declared_at(len(self.text))

    def find(self, char: str, pos: int) -> int:
        """Index of the first `char` at or after `pos` outside every span, or -1. Remembered: an
        answer holds for any later position up to it, so calls at growing positions stay linear."""
        asked, at = self.found.get(char, (len(self.text) + 1, -1))
        if asked <= pos and (at < 0 or at >= pos):
            return at
        at = self.text.find(char, pos)
        while at >= 0 and at in self:
            at = self.text.find(char, self.ends[bisect.bisect_right(self.starts, at) - 1])
        self.found[char] = (pos, at)
        return at

    def group_end(self, pos: int) -> int | None:
        """Index of the } closing the { at `pos` as `read_group` reads it, -1 when none does; None
        when unknown: before the first { found `unclosed` (`read_group` then scans, as a group
        is short), or where the pass from it skips this one (in a span)."""
        return None if self.groups is None or pos < self.groups.start else self.groups.end(pos)

    def unclosed(self, pos: int) -> None:
        """Note that the { at `pos` has no }: from here on one lazy pass answers `group_end`, so a
        run of unclosed groups costs one read of the text, not one each."""
        if self.groups is None or pos < self.groups.start:
            self.groups = GroupEnds(read_braces(self.text, self.starts, self.ends, pos), pos)

    def search(self, pattern: re.Pattern, pos: int = 0) -> re.Match | None:
        """The first match of `pattern` in the text at or after `pos` that starts outside every
        span (an example shown in a verbatim is not the real thing)."""
        for m in pattern.finditer(self.text, pos):
            if m.start() not in self:
                return m
        return None

