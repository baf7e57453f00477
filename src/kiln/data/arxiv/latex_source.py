"""LaTeX source plumbing: comments, the main file, \\input/\\include resolution inside the archive.

The archive is an in-memory dict, so an include is a dict lookup of a normalised path relative to
the main file's folder (as TeX resolves it). Absolute paths and paths that climb out of the
archive root (``\\input{../../x}``) are refused and counted; nothing outside the dict is ever read.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter

# A % preceded by an even number of backslashes starts a comment; TeX also drops the newline
# and the next line's leading blanks. `50\%` is an escaped percent sign and survives.
COMMENT = re.compile(r"(?<!\\)((?:\\\\)*)%[^\n]*(?:\n[ \t]*)?")
DOCCLASS = re.compile(r"\\document(?:class|style)\s*(?:\[[^\]]*\])?\s*\{\s*([^}]*)\}")
INCLUDE = re.compile(r"\\(input|include|subfile)(?![a-zA-Z@])\s*(?:\{([^{}]*)\}|([^\s{}\\%]+))")
BEGIN_DOC = "\\begin{document}"
END_DOC = "\\end{document}"
MAX_INCLUDE_DEPTH = 20


def strip_comments(text: str) -> str:
    """Remove % comments the way TeX does (the next line is joined without its indent)."""
    if "%" not in text:
        return text
    return COMMENT.sub(r"\1", text)


def find_main_file(files: dict[str, str]) -> str | None:
    """The root .tex file, or None.

    Candidates contain ``\\documentclass`` (or LaTeX 2.09 ``\\documentstyle``) or
    ``\\begin{document}``. Tie-break, in order: has both; is not a `subfiles`/`standalone`
    child; the longest text; then the first name in sorted order.
    """
    best: tuple | None = None
    for name in sorted(files):
        if not name.lower().endswith((".tex", ".ltx", ".latex")):
            continue
        text = strip_comments(files[name])
        cls = DOCCLASS.search(text)
        has_begin = BEGIN_DOC in text
        if not cls and not has_begin:
            continue
        child = bool(cls) and cls.group(1).strip() in ("subfiles", "standalone")
        key = (bool(cls) and has_begin, not child, len(text))
        if best is None or key > best[0]:
            best = (key, name)
    return best[1] if best else None


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


def resolve_includes(files: dict[str, str], main: str, counts: Counter) -> str:
    """The main file with \\input/\\include/\\subfile replaced by the (comment-free) targets.

    Counts ``includes_resolved``, ``includes_refused`` (outside the archive),
    ``includes_missing`` (not in the archive: figures' .pstex_t, .bbl...), ``includes_cycle``.
    """
    base_dir = posixpath.dirname(main)
    cache: dict[str, str] = {}

    def expand(name: str, stack: tuple[str, ...]) -> str:
        if name not in cache:
            cache[name] = strip_comments(files[name])
        text = cache[name]
        if "\\in" not in text and "\\subfile" not in text:
            return text

        def replace(m: re.Match) -> str:
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
            return _subfile_body(body) if kind == "subfile" else f"\n{body}\n"

        return INCLUDE.sub(replace, text)

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
