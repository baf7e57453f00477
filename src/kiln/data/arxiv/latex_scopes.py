"""Where each of the body's macro definitions holds, as TeX scopes it, for `expand_macros`.

`collect_definitions` makes one table of the whole document's macros, later winning, so a
\\renewcommand (\\renewenvironment, \\def...) in the body changed the text before it, and one made
inside a group ({...}, \\begingroup...\\endgroup, an environment) the text after the group:
TeX's definitions are local to their group (bar \\gdef, \\xdef and \\global) and hold from where
they stand. Here the body is cut where a meaning changes (a redefinition, a group-local
definition, its group's end restoring the meaning before) and each stretch is expanded with the
table in force there. A name defined once and unknown before is in force all through, as
before, wherever it stands (a use before it, or after the group it was made in, would be an
error in TeX or a package's meaning the converter does not know): most papers cut nothing.

One scan of the body's groups, outside literal spans. Past `MAX_STRETCHES` stretches the body is
expanded with one table as before (counted: ``macros_scopes_over_budget``), so a paper
redefining a macro thousands of times costs no more than one table per stretch allows. A macro
whose arguments cross a cut (a definition inside its argument) is left unexpanded.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans
from kiln.data.arxiv.latex_macros import (
    Definition,
    Macro,
    _ends_with_control_word,
    _starts_with_letter,
    expand_macros,
)

MAX_STRETCHES = 64
# a group's opener or closer (an environment's \\begin{x} and \\end{x} whole), or an escaped
# brace or backslash (\\{ opens nothing; \\\\{ is a line break, then a group)
GROUPING = re.compile(r"(\\(?:begingroup|bgroup)(?![a-zA-Z@])|\\begin\s*\{[^{}\\]*\}|\{)"
                      r"|(\\(?:endgroup|egroup)(?![a-zA-Z@])|\\end\s*\{[^{}\\]*\}|\})|\\[{}\\]")
_MISSING = None  # a name undefined before a local definition: restored by removing it


def _group_changes(text: str, spans: LiteralSpans) -> Iterator[tuple[int, int]]:
    """(position, +1 or -1) of each group's start and end in `text`, outside literal spans (walked
    beside the matches, both in order), lazily; an end at the character after its closer, where
    the meaning before the group is back."""
    k, starts, ends = 0, spans.starts, spans.ends
    n = len(starts)
    for m in GROUPING.finditer(text):
        kind = m.lastindex  # 1 an opener, 2 a closer, None an escape
        if kind is None:
            continue
        at = m.start()
        while k < n and ends[k] <= at:
            k += 1
        if k < n and starts[k] <= at:
            continue  # inside a literal span
        yield (at, 1) if kind == 1 else (m.end(), -1)


def expand_scoped(
    text: str, before: dict[str, Macro], definitions: list[Definition], counts: Counter,
    declared: Declared = NO_DECLARATIONS,
) -> str:
    """`text` (the body without its definitions) with its macros expanded: `before`, the
    preamble's (and local packages'), and over them each of `definitions` where TeX says it holds.
    The groups are read up to the last definition, then only until the last meaning it made in a
    group is restored."""
    defined = Counter(d.name for d in definitions)
    current = dict(before)
    walked = []  # the definitions that change a meaning: the rest hold all through
    for d in definitions:
        if d.name not in before and defined[d.name] == 1:
            current[d.name] = d.macro
        else:
            walked.append(d)
    if not walked:
        return expand_macros(text, current, counts, declared)
    spans = LiteralSpans(text, declared)
    groups = _group_changes(text, spans)
    stretches: list[tuple[int, int, dict[str, Macro]]] = []
    start = depth = 0
    saves: list[tuple[int, dict[str, Macro | None]]] = []  # (depth, the meanings to restore at its end)

    def change(pos: int, name: str, macro: Macro | None) -> None:
        nonlocal start
        if current.get(name) == macro:
            return
        if pos > start:
            stretches.append((start, pos, dict(current)))
            start = pos
        if macro is None:
            current.pop(name, None)
        else:
            current[name] = macro

    group = next(groups, None)
    for d in [*walked, None]:
        until = len(text) + 1 if d is None else d.pos
        # a group opened where a definition stood opens after it; one closed there, before it
        while group is not None and (group[0] < until or (group[0] == until and group[1] < 0)):
            pos, step = group
            if step > 0:
                depth += 1
            elif depth:  # a stray closer closes nothing
                if saves and saves[-1][0] == depth:
                    for name, old in reversed(saves.pop()[1].items()):
                        change(pos, name, old)
                depth -= 1
            group = None if d is None and not saves else next(groups, None)
        if len(stretches) >= MAX_STRETCHES:
            counts["macros_scopes_over_budget"] += 1
            return expand_macros(text, {**before, **{x.name: x.macro for x in definitions}}, counts, declared)
        if d is None:
            break
        if not d.is_global and depth:
            if not saves or saves[-1][0] != depth:
                saves.append((depth, {}))
            saves[-1][1].setdefault(d.name, current.get(d.name, _MISSING))
        change(d.pos, d.name, d.macro)
    stretches.append((start, len(text), current))
    out: list[str] = []
    for s, e, macros in stretches:
        piece = expand_macros(text[s:e], macros, counts, spans.declared_at(s))
        if out and _starts_with_letter(piece) and _ends_with_control_word(out[-1], len(out[-1])):
            piece = " " + piece  # \\begingroup then a macro's text: two tokens, as in one stretch
        out.append(piece)
    return "".join(out)
