"""Drop what an ``\\iffalse ... \\fi`` hides, as TeX skips it.

Authors hide old drafts, notes to co-authors and replies to referees in ``\\iffalse`` blocks
(as in a comment environment); the converter read ``\\iffalse`` and ``\\fi`` as unknown
macros and kept the hidden text. TeX skips from ``\\iffalse`` to its matching ``\\fi``,
counting the conditionals nested in between, or to an ``\\else`` at its own level (the
else-branch is read). Only TeX's own conditionals, LaTeX's internal ``\\if@...`` ones and
those the text declares with ``\\newif`` nest: etoolbox's ``\\ifdef{..}{..}{..}``,
``\\ifthenelse`` and math's ``\\iff`` have no ``\\fi``. An ``\\iffalse`` inside a literal
span (``\\verb``, a verbatim) is text; within a skipped block every token counts, as TeX reads
it. An unclosed ``\\iffalse`` (TeX stops with an error) hides nothing (``iffalse_unclosed``).
Only an ``\\iffalse`` that runs counts: not one in a group (a definition's body,
``\\newcommand{\\ifnotes}{\\iffalse}``) nor one named by ``\\let\\ifdraft\\iffalse``, which
hid the text up to the paper's next ``\\fi``.
"""

from __future__ import annotations

import re
from collections import Counter

from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans

CONTROL = re.compile(r"\\(?:([a-zA-Z@]+)|[\s\S]?)")  # a control word (group 1), or `\\`, `\%`...
CONTROL_OR_BRACE = re.compile(r"\\(?:([a-zA-Z@]+)|[\s\S]?)|([{}])")
# an \iffalse that is not run but named: \let\ifdraft\iffalse, \let\x=\iffalse, ...\endcsname\iffalse
NAMED_BEFORE = re.compile(r"(?:\\let\s*\\[a-zA-Z@]+|\\endcsname)\s*=?\s*\Z")
NEWIF = re.compile(r"\\newif\s*\\(if[a-zA-Z@]+)")
PRIMITIVE_IFS = frozenset(
    "if ifcat ifnum ifdim ifodd ifvmode ifhmode ifmmode ifinner ifvoid ifhbox ifvbox ifx ifeof "
    "iftrue iffalse ifcase ifdefined ifcsname iffontchar ifincsname ifpdfprimitive ifpdfabsnum "
    "ifpdfabsdim ifpdf ifxetex ifluatex ifpdftex ifvtex".split()
)


def drop_false_branches(text: str, counts: Counter, declared: Declared = NO_DECLARATIONS) -> str:
    """`text` without its ``\\iffalse`` blocks (counted: ``iffalse_dropped``); `declared`: the
    declarations in force where `text` starts (for its literal spans)."""
    if "\\iffalse" not in text:
        return text
    ifs = PRIMITIVE_IFS | set(NEWIF.findall(text))
    spans: LiteralSpans | None = None
    out, pos, start, depth = [], 0, -1, 0
    braces = 0  # group depth outside skipped blocks: an \iffalse in a group is a definition's
    for m in CONTROL_OR_BRACE.finditer(text):
        name = m.group(1)
        if name is None:
            if depth == 0 and m.group(2):
                spans = spans or LiteralSpans(text, declared)
                if m.start() not in spans:
                    braces = braces + 1 if m.group(2) == "{" else max(braces - 1, 0)
            continue
        if depth == 0:
            if name == "iffalse" and not braces and not NAMED_BEFORE.search(text, max(m.start() - 80, 0), m.start()):
                spans = spans or LiteralSpans(text, declared)
                if m.start() not in spans:
                    start, depth = m.start(), 1
            continue
        if name in ifs or name.startswith("if@"):
            depth += 1
        elif name == "fi" or (name == "else" and depth == 1):
            depth -= 1
            if depth == 0:
                out.append(text[pos:start])
                pos = m.end()
                counts["iffalse_dropped"] += 1
    if depth:
        counts["iffalse_unclosed"] += 1
    out.append(text[pos:])
    return "".join(out)
