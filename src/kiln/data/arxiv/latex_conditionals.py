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
Only an ``\\iffalse`` that runs counts: not one in a definition's body
(``\\newcommand{\\ifnotes}{\\iffalse}``, ``\\newenvironment{hide}{\\iffalse}{\\fi}``) nor one
named by ``\\let\\ifdraft\\iffalse``, which hid the text up to the paper's next ``\\fi``; one in
a plain group (``{\\iffalse ...\\fi}``, ``\\textbf{..}``) runs. Conditionals a local package
declares (its ``\\newif``) nest like those of the text.
"""

from __future__ import annotations

import re
from collections import Counter

from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans

CONTROL = re.compile(r"\\(?:([a-zA-Z@]+)|[\s\S]?)")  # a control word (group 1), or `\\`, `\%`...
CONTROL_OR_BRACE = re.compile(r"\\(?:([a-zA-Z@]+)|[\s\S]?)|([{}])")
# an \iffalse that is not run but named: \let\ifdraft\iffalse, \let\x=\iffalse, ...\endcsname\iffalse
NAMED_BEFORE = re.compile(r"(?:\\let\s*\\[a-zA-Z@]+|\\endcsname)\s*=?\s*\Z|\\newif\s*\Z")
# what may set a \newif switch (\drafttrue, \csname drafttrue\endcsname, \@nameuse{drafttrue},
# \setboolean{draft}{true}) or make it another conditional (\let\ifdraft\iftrue, \def\ifdraft,
# \expandafter\let\csname ifdraft\endcsname\iftrue): its name, in one group. Loose on purpose:
# a switch wrongly kept costs a draft note; one wrongly dropped, the paper's text.
SWITCH_SET = re.compile(r"(?<![a-zA-Z@])([a-zA-Z@]+)true(?![a-zA-Z@])"
                        r"|\\(?:let|[gex]?def)\s*\\if([a-zA-Z@]+)(?![a-zA-Z@])"
                        r"|\\csname\s*if([a-zA-Z@]+)\s*\\endcsname"
                        r"|\\set(?:boolean|bool)\s*\{\s*([a-zA-Z@]+)\s*\}\s*\{\s*(?i:true)"
                        # a \newif under a test that the switch exists (`\@ifundefined{ifdraft}
                        # {\newif\ifdraft}{}`): a class not in the archive may declare and set it
                        r"|\\(?:@ifundefined|ifcsname|ifdefined|ifx|ifdef|ifundef|ifcsdef|ifcsundef)"
                        r"\s*\{?\s*\\?if([a-zA-Z@]+)(?![a-zA-Z@])")
NEWIF = re.compile(r"\\newif\s*\\(if[a-zA-Z@]+)")
_BODY = r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"  # an environment's begin code, two levels deep
# What precedes the { of a definition's body: \def\x#1, \newcommand{\x}[1][d], xparse's
# {\x}{spec}, \newenvironment{x}[1] (and its {begin code} before the {end code})
DEFINITION_HEAD = re.compile(
    r"\\(?:[gex]?def\s*\\(?:[a-zA-Z@]+|[^a-zA-Z@])[^{}]*"
    r"|(?:(?:re)?newcommand|providecommand|DeclareRobustCommand)\*?\s*"
    r"(?:\{\s*\\[^{}]*\}|\\(?:[a-zA-Z@]+|[^a-zA-Z@]))\s*(?:\[[^\]]*\]\s*)*"
    r"|(?:New|Renew|Provide|Declare)DocumentCommand\s*(?:\{[^{}]*\}|\\[a-zA-Z@]+)\s*\{[^{}]*\}\s*"
    rf"|(?:(?:re)?newenvironment|provideenvironment)\*?\s*\{{[^{{}}]*\}}\s*(?:\[[^\]]*\]\s*)*(?:{_BODY}\s*)?"
    rf"|(?:New|Renew|Provide|Declare)DocumentEnvironment\s*\{{[^{{}}]*\}}\s*\{{[^{{}}]*\}}\s*(?:{_BODY}\s*)?"
    r")\Z"
)
DEFINITION_LOOKBACK = 400  # characters, and backslashes, a definition's head may take
DEFINITION_BACKSLASHES = 16
PRIMITIVE_IFS = frozenset(
    "if ifcat ifnum ifdim ifodd ifvmode ifhmode ifmmode ifinner ifvoid ifhbox ifvbox ifx ifeof "
    "iftrue iffalse ifcase ifdefined ifcsname iffontchar ifincsname ifpdfprimitive ifpdfabsnum "
    "ifpdfabsdim ifpdf ifxetex ifluatex ifpdftex ifvtex".split()
)


def _opens_definition(text: str, brace: int) -> bool:
    """Whether the { at `brace` opens a definition's body (its code runs later, not here): the
    head is tried from each of the last `DEFINITION_BACKSLASHES` backslashes before it."""
    at, lowest = brace, max(brace - DEFINITION_LOOKBACK, 0)
    for _ in range(DEFINITION_BACKSLASHES):
        at = text.rfind("\\", lowest, at)
        if at < 0:
            return False
        if DEFINITION_HEAD.match(text, at, brace):
            return True
    return False


def _never_set(text: str, packages: str) -> set[str]:
    """The conditionals `text` declares with \\newif and nothing sets (no \\drafttrue, no
    \\let or \\def of \\ifdraft, in `text` or the local `packages`): false, as \\newif leaves them."""
    if "\\newif" not in text:
        return set()
    declared = set(NEWIF.findall(text))
    for source in (text, packages):
        for m in SWITCH_SET.finditer(source):
            declared.discard("if" + next(name for name in m.groups() if name))
    return declared


def drop_false_branches(
    text: str,
    counts: Counter,
    declared: Declared = NO_DECLARATIONS,
    conditionals: frozenset[str] = frozenset(),
    packages: str = "",
) -> str:
    """`text` without its ``\\iffalse`` blocks (counted: ``iffalse_dropped``), nor those of the
    conditionals it declares with \\newif and never sets true (``\\newif\\ifdraft ... \\ifdraft
    notes\\fi``: ``newif_false_dropped``); `declared`: the declarations in force where `text`
    starts (for its literal spans); `conditionals`: the \\newif names declared outside `text`
    (by its local packages), `packages`: their text (where a switch may be set)."""
    false_ifs = {"iffalse"} | _never_set(text, packages)
    if "\\iffalse" not in text and len(false_ifs) == 1:
        return text
    ifs = PRIMITIVE_IFS | conditionals | set(NEWIF.findall(text))
    spans: LiteralSpans | None = None
    out, pos, start, depth, dropping = [], 0, -1, 0, ""
    groups: list[int] = []  # open groups outside skipped blocks (where their { stands)
    checked = 0  # groups[:checked] were asked whether they are a definition's body
    definition = -1  # the index in `groups` of the outermost one that is, or -1
    for m in CONTROL_OR_BRACE.finditer(text):
        name = m.group(1)
        if name is None:
            if depth == 0 and m.group(2):
                spans = spans or LiteralSpans(text, declared)
                if m.start() not in spans:
                    if m.group(2) == "{":
                        groups.append(m.start())
                    elif groups:
                        groups.pop()
                        checked = min(checked, len(groups))
                        definition = definition if definition < len(groups) else -1
            continue
        if depth == 0:
            if name in false_ifs and not NAMED_BEFORE.search(text, max(m.start() - 80, 0), m.start()):
                while definition < 0 and checked < len(groups):
                    definition = checked if _opens_definition(text, groups[checked]) else -1
                    checked += 1
                if definition >= 0:
                    continue
                spans = spans or LiteralSpans(text, declared)
                if m.start() not in spans:
                    start, depth, dropping = m.start(), 1, name
            continue
        if name in ifs or name.startswith("if@"):
            depth += 1
        elif name == "fi" or (name == "else" and depth == 1):
            depth -= 1
            if depth == 0:
                out.append(text[pos:start])
                pos = m.end()
                counts["iffalse_dropped" if dropping == "iffalse" else "newif_false_dropped"] += 1
    if depth:
        counts["iffalse_unclosed"] += 1
    out.append(text[pos:])
    return "".join(out)
