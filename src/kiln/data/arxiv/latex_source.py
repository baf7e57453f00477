"""LaTeX source plumbing: comments, the main file, \\input/\\include resolution inside the archive.

The archive is an in-memory dict, so an include is a dict lookup of a normalised path relative to
the main file's folder (as TeX resolves it). Absolute paths and paths that climb out of the
archive root (``\\input{../../x}``) are refused and counted; nothing outside the dict is ever read.
"""

from __future__ import annotations

import bisect
import posixpath
import re
from collections import Counter
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
DOCCLASS = re.compile(r"\\document(?:class|style)\s*(?:\[[^\]]*\])?\s*\{\s*([^}]*)\}")
INCLUDE = re.compile(r"\\(input|include|subfile)(?![a-zA-Z@])\s*(?:\{([^{}]*)\}|([^\s{}\\%]+))")
BEGIN_DOC = "\\begin{document}"
END_DOC = "\\end{document}"
MAX_INCLUDE_DEPTH = 20
# Include expansion budget, in characters: INCLUDE_GROWTH x the archive's text, at least
# MIN_INCLUDE_BUDGET, at most MAX_INCLUDE_BUDGET. A paper includes each file about once (nested
# files are counted once per level), so only a fan-out (a file \input many times, each input
# \input-ing more) reaches it; one such 673-byte archive expanded to 109 MB in 8 s.
INCLUDE_GROWTH = 4
MIN_INCLUDE_BUDGET = 4 * 1024 * 1024
MAX_INCLUDE_BUDGET = 64 * 1024 * 1024


class LatexRefused(Exception):
    """The whole document is refused; `reason` is the stat key (``refused/<reason>``)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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


def strip_comments(text: str) -> str:
    """Remove % comments the way TeX does (the next line is joined without its indent, a blank
    next line still breaks the paragraph); a % inside a literal span (\\url, \\verb...) stays."""
    if "%" not in text:
        return text
    out, pos = [], 0
    for span in _spans(text, LITERAL_OR_COMMENT):
        if span.kind == "%":
            out.append(text[pos : span.start])
            pos = span.end
    out.append(text[pos:])
    return "".join(out)


def find_main_file(files: dict[str, str]) -> str | None:
    """The root .tex file, or None.

    Candidates contain ``\\documentclass`` (or LaTeX 2.09 ``\\documentstyle``) or
    ``\\begin{document}``. Tie-break, in order: has both; is not a `subfiles`/`standalone`
    child; is not included by another candidate; the longest text with its includes resolved
    (a main file that is only ``\\input`` lines beats a longer standalone supplement); then the
    first name in sorted order.
    """
    texts: dict[str, str] = {}

    def text_of(name: str) -> str:
        if name not in texts:
            texts[name] = strip_comments(files[name])
        return texts[name]

    ranks: dict[str, tuple[bool, bool]] = {}
    for name in sorted(files):
        if not name.lower().endswith((".tex", ".ltx", ".latex")):
            continue
        text = text_of(name)
        cls = DOCCLASS.search(text)
        has_begin = BEGIN_DOC in text
        if not cls and not has_begin:
            continue
        child = bool(cls) and cls.group(1).strip() in ("subfiles", "standalone")
        ranks[name] = (bool(cls) and has_begin, not child)
    targets: dict[tuple[str, str], list[str]] = {}
    reach = {name: _reachable(files, name, text_of, targets) for name in ranks}
    included = {other for name, found in reach.items() for other in found if other != name}
    best: tuple | None = None
    for name in ranks:  # sorted: a tie keeps the first name
        key = (*ranks[name], name not in included, sum(len(text_of(f)) for f in reach[name]))
        if best is None or key > best[0]:
            best = (key, name)
    return best[1] if best else None


def _includes(text: str) -> Iterator[re.Match]:
    """The \\input/\\include/\\subfile commands of `text`, outside literal spans (\\verb...)."""
    spans = None
    for m in INCLUDE.finditer(text):
        if spans is None:
            spans = LiteralSpans(text)
        if m.start() not in spans:
            yield m


def _reachable(files: dict[str, str], main: str, text_of, targets: dict) -> set[str]:
    """`main` and the archive files it includes, transitively (resolved from main's folder)."""
    base_dir = posixpath.dirname(main)
    seen, todo = {main}, [main]
    while todo:
        name = todo.pop()
        if (base_dir, name) not in targets:
            found = []
            for m in _includes(text_of(name)):
                path = normalise_include(base_dir, m.group(2) if m.group(2) is not None else m.group(3))
                if path is not None and (target := _lookup(files, path)) is not None:
                    found.append(target)
            targets[base_dir, name] = found
        for target in targets[base_dir, name]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def normalise_include(base_dir: str, target: str) -> str | None:
    """Archive-relative path for an include target, or None when it would leave the archive."""
    target = target.strip().strip('"').replace("\\", "/")
    if not target or target.startswith("/") or (len(target) > 1 and target[1] == ":"):
        return None
    path = posixpath.normpath(posixpath.join(base_dir, target))
    if path == ".." or path.startswith("../") or path.startswith("/"):
        return None
    return path


def _lookup(files: dict[str, str], path: str) -> str | None:
    for candidate in (path, path + ".tex"):
        if candidate in files:
            return candidate
    return None


def _subfile_body(text: str) -> str:
    start = text.find(BEGIN_DOC)
    if start < 0:
        return text
    end = text.find(END_DOC, start)
    return text[start + len(BEGIN_DOC) : end if end >= 0 else len(text)]


def include_budget(files: dict[str, str]) -> int:
    """Characters that include expansion may produce for this archive (see INCLUDE_GROWTH)."""
    total = sum(len(text) for text in files.values())
    return min(MAX_INCLUDE_BUDGET, max(MIN_INCLUDE_BUDGET, INCLUDE_GROWTH * total))


def resolve_includes(files: dict[str, str], main: str, counts: Counter, budget: int | None = None) -> str:
    """The main file with \\input/\\include/\\subfile replaced by the (comment-free) targets.

    Counts ``includes_resolved``, ``includes_refused`` (outside the archive),
    ``includes_missing`` (not in the archive: figures' .pstex_t, .bbl...), ``includes_cycle``.
    Raises `LatexRefused("include_budget")` once the inserted text passes `budget` characters
    (default `include_budget(files)`), before a fan-out of includes can exhaust memory.
    """
    base_dir = posixpath.dirname(main)
    cache: dict[str, str] = {}
    limit = include_budget(files) if budget is None else budget
    used = 0

    def expand(name: str, stack: tuple[str, ...]) -> str:
        if name not in cache:
            cache[name] = strip_comments(files[name])
        text = cache[name]
        if "\\in" not in text and "\\subfile" not in text:
            return text

        def replace(m: re.Match) -> str:
            nonlocal used
            kind, target = m.group(1), m.group(2) if m.group(2) is not None else m.group(3)
            path = normalise_include(base_dir, target)
            if path is None:
                counts["includes_refused"] += 1
                return ""
            found = _lookup(files, path)
            if found is None:
                counts["includes_missing"] += 1
                return ""
            if found in stack or len(stack) >= MAX_INCLUDE_DEPTH:
                counts["includes_cycle"] += 1
                return ""
            counts["includes_resolved"] += 1
            body = expand(found, (*stack, found))
            used += len(body)
            if used > limit:
                raise LatexRefused("include_budget", f"includes expand past {limit} characters")
            return _subfile_body(body) if kind == "subfile" else f"\n{body}\n"

        out, pos = [], 0
        for m in _includes(text):
            out.append(text[pos : m.start()])
            out.append(replace(m))
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)

    return expand(main, (main,))


def split_document(text: str) -> tuple[str, str]:
    """(preamble, body): body is between \\begin{document} and \\end{document} (or the end)."""
    start = text.find(BEGIN_DOC)
    if start < 0:
        return "", text
    end = text.find(END_DOC, start)
    return text[:start], text[start + len(BEGIN_DOC) : end if end >= 0 else len(text)]


def read_group(text: str, pos: int) -> tuple[str, int] | None:
    """Content of the balanced {...} starting at text[pos] == '{', and the index after it."""
    depth = 0
    i = pos
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : i], i + 1
        i += 1
    return None


def read_bracket(text: str, pos: int) -> tuple[str, int] | None:
    """Content of [...] starting at text[pos] == '[' (braces inside are skipped whole)."""
    i = pos + 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            group = read_group(text, i)
            if group is None:
                return None
            i = group[1]
            continue
        if c == "]":
            return text[pos + 1 : i], i + 1
        i += 1
    return None


def skip_blanks(text: str, pos: int) -> int:
    """Skip spaces, tabs and at most one newline (TeX's rule between undelimited arguments)."""
    n = len(text)
    newline = False
    while pos < n and text[pos] in " \t\n":
        if text[pos] == "\n":
            if newline:
                break
            newline = True
        pos += 1
    return pos
