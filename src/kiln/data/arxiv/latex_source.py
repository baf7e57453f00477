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

from kiln.data.arxiv.latex_conditionals import CONTROL_OR_BRACE, NAMED_BEFORE, NEWIF, PRIMITIVE_IFS
from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans, literal_spans

DOCCLASS = re.compile(r"\\document(?:class|style)\s*(?:\[[^\]]*\])?\s*\{\s*([^}]*)\}")
INCLUDE = re.compile(
    r"\\(?:(?P<kind>input|includeonly|include|subfile)(?![a-zA-Z@])\s*(?:\{(?P<braced>[^{}]*)\}|(?P<bare>[^\s{}\\%]+))"
    r"|(?P<sub>sub)?(?:import|inputfrom|includefrom)\*?\s*\{(?P<dir>[^{}]*)\}\s*\{(?P<file>[^{}]*)\})"
)
# TeX skips blanks between \begin and its {argument}: `\begin {document}` is the same marker
BEGIN_DOC = re.compile(r"\\begin\s*\{document\}")
END_DOC = re.compile(r"\\end\s*\{document\}")
BRACKET_STOP = re.compile(r"[\\{\[\]]")  # what `read_bracket` stops at: an escape, a group, a [ or its ]
# An \input file's last line end is a space, as any line's; only a blank last line ends a paragraph.
# (Kept as "\n", it made a blank line with the includer's own line end: `\input{x}` alone on a
# line mid-paragraph split it.)
FILE_ENDS_PARAGRAPH = re.compile(r"\n[ \t]*\n[ \t]*\Z")
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


def strip_comments(text: str, declared: Declared = NO_DECLARATIONS) -> str:
    """Remove % comments the way TeX does (the next line is joined without its indent, a blank
    next line still breaks the paragraph); a % inside a literal span (\\url, \\verb...) stays.
    `declared`: the declarations (short verbs, verbatim-like environments) in force where `text`
    starts."""
    if "%" not in text:
        return text
    out, pos = [], 0
    for span in literal_spans(text, comments=True, declared=declared):
        if span.kind == "%":
            out.append(text[pos : span.start])
            pos = span.end
    out.append(text[pos:])
    return "".join(out)


def cut_at_endinput(text: str, declared: Declared = NO_DECLARATIONS) -> str:
    """`text` up to the end of the line of its first \\endinput outside literal spans: TeX reads
    no further in that file (an \\input file's old notes, a .sty file's documentation).
    Only an \\endinput that runs where it stands counts: not one in a group (a definition's
    body, `\\newcommand{\\stop}{\\endinput}`), one named (`\\let\\stop\\endinput`) nor one
    in a conditional (a load guard, `\\ifx\\loaded\\relax\\endinput\\fi`, read on the first
    load): each cut the rest of the paper."""
    if "\\endinput" not in text:
        return text
    spans = LiteralSpans(text, declared)
    ifs = PRIMITIVE_IFS | set(NEWIF.findall(text))
    braces = ifs_open = 0
    for m in CONTROL_OR_BRACE.finditer(text):
        name = m.group(1)
        if m.start() in spans:
            continue
        if name is None:
            if m.group(2):
                braces = braces + 1 if m.group(2) == "{" else max(braces - 1, 0)
        elif name in ifs or name.startswith("if@"):
            ifs_open += 1
        elif name == "fi":
            ifs_open = max(ifs_open - 1, 0)
        elif (name == "endinput" and not braces and not ifs_open
              and not NAMED_BEFORE.search(text, max(m.start() - 80, 0), m.start())):
            eol = text.find("\n", m.end())
            rest = text[m.end() : eol + 1 if eol >= 0 else len(text)]
            # a line holding \endinput alone is no blank line (no paragraph end after it)
            return text[: m.start()] + (rest if rest.strip() else "")
    return text


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
        has_begin = BEGIN_DOC.search(text) is not None
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


def _includes(text: str, declared: Declared = NO_DECLARATIONS) -> Iterator[tuple[re.Match, Declared]]:
    """The \\input/\\include/\\subfile commands of `text`, outside literal spans (\\verb...), each
    with the declarations in force there (`declared` where `text` starts)."""
    spans = None
    for m in INCLUDE.finditer(text):
        if spans is None:
            spans = LiteralSpans(text, declared)
        if m.start() not in spans:
            yield m, spans.declared_at(m.start())


def _reachable(files: dict[str, str], main: str, text_of, targets: dict) -> set[str]:
    """`main` and the archive files it includes, transitively (resolved from main's folder)."""
    base_dir = posixpath.dirname(main)
    seen, todo = {main}, [main]
    while todo:
        name = todo.pop()
        if (base_dir, name) not in targets:
            found = []
            for m, _ in _includes(text_of(name)):
                if m["kind"] == "includeonly":
                    continue
                if (target := _include_target(files, base_dir, base_dir, m)[0]) is not None:
                    found.append(target)
            targets[base_dir, name] = found
        for target in targets[base_dir, name]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _include_target(files: dict[str, str], base_dir: str, cur: str, m: re.Match) -> tuple[str | None, str | None]:
    """(archive file an include names, or None; the folder its own \\subimport and \\input
    start from, None when the path leaves the archive). \\input/\\include/\\subfile name a
    path from the main file's folder (`base_dir`), or else, inside an imported file, from its
    folder `cur` (the import package adds it to the search path); \\import{dir}{file}
    (\\inputfrom, \\includefrom) from the main file's folder, \\subimport{dir}{file}
    (\\subinputfrom, \\subincludefrom) from `cur`."""
    if m["kind"] is None:
        folder = normalise_include(cur if m["sub"] else base_dir, m["dir"] or ".")
        path = None if folder is None else normalise_include(folder, m["file"])
        return (None, None) if path is None else (_lookup(files, path), folder)
    target = m["braced"] if m["braced"] is not None else m["bare"]
    for where in dict.fromkeys((base_dir, cur)):
        path = normalise_include(where, target)
        if path is None:
            return None, None
        if (found := _lookup(files, path)) is not None:
            return found, cur
    return None, cur


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
    start = BEGIN_DOC.search(text)
    if start is None:
        return text
    end = END_DOC.search(text, start.end())
    return text[start.end() : end.start() if end else len(text)]


def include_budget(files: dict[str, str]) -> int:
    """Characters that include expansion may produce for this archive (see INCLUDE_GROWTH)."""
    total = sum(len(text) for text in files.values())
    return min(MAX_INCLUDE_BUDGET, max(MIN_INCLUDE_BUDGET, INCLUDE_GROWTH * total))


def resolve_includes(
    files: dict[str, str], main: str, counts: Counter, budget: int | None = None, declared: Declared = NO_DECLARATIONS
) -> str:
    """The main file with \\input/\\include/\\subfile and the import package's \\import/\\subimport
    (`_include_target`) replaced by the (comment-free) targets, each file read up to its
    \\endinput (`cut_at_endinput`). A target that is a whole document (a TikZ figure made with
    the standalone class) gives its body only, as the standalone package reads it: its
    \\end{document} ended the paper there.

    An \\input reads its file in line (a mid-sentence `\\input{n}` keeps the sentence whole, its
    last line end a space as in TeX); an \\include starts a new page, so a new paragraph, and
    after \\includeonly{a,b} in the preamble reads only the files it lists.
    Counts ``includes_resolved``, ``includes_excluded`` (not in \\includeonly),
    ``includes_refused`` (outside the archive), ``includes_missing`` (not in the archive:
    figures' .pstex_t, .bbl...), ``includes_cycle``.
    Raises `LatexRefused("include_budget")` once the inserted text passes `budget` characters
    (default `include_budget(files)`), before a fan-out of includes can exhaust memory.
    An included file's comments are stripped with the declarations (\\MakeShortVerb,
    \\lstnewenvironment...) in force at its \\input; one it declares reaches the text after the
    \\input only once merged (not the includer's comments, which are stripped first). `declared`:
    those in force where the main file starts (a local package's).
    """
    base_dir = posixpath.dirname(main)
    texts: dict[tuple[str, Declared], str] = {}
    limit = include_budget(files) if budget is None else budget
    used = 0
    only: set[str] | None = None  # \includeonly's list, once met in the preamble
    body_started = False  # \begin{document} passed: an \includeonly there is an error, or text

    def expand(name: str, stack: tuple[str, ...], declared: Declared, cur: str) -> str:
        if (name, declared) not in texts:
            texts[name, declared] = cut_at_endinput(strip_comments(files[name], declared), declared)
        text = texts[name, declared]
        if "\\in" not in text and "\\sub" not in text and "\\import" not in text:
            return text

        def replace(m: re.Match, declared: Declared) -> str:
            nonlocal used, only
            if m["kind"] == "includeonly":
                listed = m["braced"] if m["braced"] is not None else m["bare"]
                if not body_started:
                    only = {name.strip() for name in listed.split(",") if name.strip()}
                return m.group(0)  # the converter drops it
            named = m["braced"] if m["braced"] is not None else m["bare"]
            if m["kind"] == "include" and only is not None and named.strip() not in only:
                counts["includes_excluded"] += 1
                return ""
            found, folder = _include_target(files, base_dir, cur, m)
            if folder is None:
                counts["includes_refused"] += 1
                return ""
            if found is None:
                counts["includes_missing"] += 1
                return ""
            if found in stack or len(stack) >= MAX_INCLUDE_DEPTH:
                counts["includes_cycle"] += 1
                return ""
            counts["includes_resolved"] += 1
            body = expand(found, (*stack, found), declared, folder)
            used += len(body)
            if used > limit:
                raise LatexRefused("include_budget", f"includes expand past {limit} characters")
            if m["kind"] == "subfile" or body.lstrip().startswith("\\documentclass"):
                return _subfile_body(body)  # a whole document (standalone, docmute): its body
            if m["kind"] == "include":
                return f"\n\n{body}\n\n"
            return body if not body or FILE_ENDS_PARAGRAPH.search(body) else body.rstrip("\n") + " "

        out, pos = [], 0
        nonlocal body_started
        for m, state in _includes(text, declared):
            out.append(text[pos : m.start()])
            body_started = body_started or BEGIN_DOC.search(text, pos, m.start()) is not None
            out.append(replace(m, state))
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)

    return expand(main, (main,), declared, base_dir)


def split_document(text: str, declared: Declared = NO_DECLARATIONS) -> tuple[str, str]:
    """(preamble, body): body is between \\begin{document} and \\end{document} (or the end).
    A marker inside a literal span (an example document in a verbatim, or in an environment
    `declared` by a local package) does not count; the spans are read only when a marker
    recurs, and then once."""
    spans: LiteralSpans | None = None

    def find(marker: re.Pattern, pos: int) -> re.Match | None:
        nonlocal spans
        m = marker.search(text, pos)
        if m is None or marker.search(text, m.start() + 1) is None:
            return m
        if spans is None:
            spans = LiteralSpans(text, declared)
        return spans.search(marker, m.start())

    start = find(BEGIN_DOC, 0)
    if start is None:
        return "", text
    end = find(END_DOC, start.end())
    return text[: start.start()], text[start.end() : end.start() if end else len(text)]


def _next_span(spans: LiteralSpans | None, pos: int) -> tuple[int, int]:
    """(index in `spans` of the first span starting at or after `pos`, its start or -1 when there
    is none): where `read_group` and `read_bracket` jump next."""
    if spans is None:
        return 0, -1
    k = bisect.bisect_left(spans.starts, pos)
    return k, spans.starts[k] if k < len(spans.starts) else -1


def read_group(text: str, pos: int, spans: LiteralSpans | None = None) -> tuple[str, int] | None:
    """Content of the balanced {...} starting at text[pos] == '{', and the index after it; a
    literal span of `spans` (a \\verb, \\url... of `text`) inside it is skipped whole, as the
    converter reads it, so its braces do not count."""
    remember = spans is not None and spans.text is text and text.startswith("{", pos)
    if remember and (close := spans.group_end(pos)) is not None:  # a run of unclosed groups stays linear
        return (text[pos + 1 : close], close + 1) if close >= 0 else None
    depth = 0
    i = pos
    n = len(text)
    k, skip = _next_span(spans, pos + 1)
    while i < n:
        if 0 <= skip <= i:
            i = max(i, spans.ends[k])
            k, skip = _next_span(spans, i)
            continue
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
    if remember:
        spans.unclosed(pos)
    return None


def read_bracket(text: str, pos: int, spans: LiteralSpans | None = None) -> tuple[str, int] | None:
    """Content of [...] starting at text[pos] == '[' (braces inside, and literal spans of
    `spans`, are skipped whole), and the index after it. With `spans` of `text`, each walk's stop
    is remembered for every [ it passes (not those in a group, escape or span it skips): a walk
    from such a [ goes on exactly as this one did, to the same ], so a run of unclosed [ costs
    one walk, not one to the end of the text each."""
    remember = spans.bracket_ends if spans is not None and spans.text is text else None
    if remember is not None and pos in remember:
        close = remember[pos]
        return (text[pos + 1 : close], close + 1) if close >= 0 else None
    walked = [pos]
    close = -1
    i = pos + 1
    k, skip = _next_span(spans, i)
    while True:
        if 0 <= skip <= i:
            i = max(i, spans.ends[k])
            k, skip = _next_span(spans, i)
            continue
        m = BRACKET_STOP.search(text, i)
        if m is None:
            break
        at = m.start()
        if 0 <= skip <= at:
            i = skip
            continue
        c = text[at]
        if c == "\\":
            i = at + 2
        elif c == "{":
            group = read_group(text, at, spans)
            if group is None:
                break
            i = group[1]
        elif c == "[":
            if remember is not None and at in remember:
                close = remember[at]
                break
            walked.append(at)
            i = at + 1
        else:
            close = at
            break
    if remember is not None:
        for at in walked:
            remember[at] = close
    return (text[pos + 1 : close], close + 1) if close >= 0 else None


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
