"""User macros: collect \\newcommand/\\renewcommand/\\providecommand/\\def/\\DeclareMathOperator
and expand them in text and math, with #1..#9 arguments and \\newcommand's optional default.

Not TeX: expansion is textual, in whole-document passes (a macro used inside another's body is
expanded by the next pass), at most `MAX_PASSES` passes and a growth budget, so a recursive
``\\def\\a{\\a x}`` stops. Skipped (counted): delimited \\def parameters, bodies that define
macros or use \\csname/\\expandafter, and redefinitions of structural names (\\begin, \\section...).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from kiln.data.arxiv.latex_source import read_bracket, read_group, skip_blanks

DEFINER = re.compile(
    r"\\(?:(re)?newcommand|providecommand|DeclareRobustCommand|([gex]?def)|"
    r"DeclareMathOperator|newtheorem)(?![a-zA-Z@])(\*?)"
)
NAME = re.compile(r"\\([a-zA-Z@]+|.)")
PARAM = re.compile(r"##|#([1-9])")
UNSAFE_BODY = re.compile(r"\\(?:[gex]?def|newcommand|renewcommand|let|csname|expandafter|futurelet|@ifnextchar)(?![a-zA-Z@])")
PROTECTED = frozenset(
    "begin end item section subsection subsubsection paragraph chapter part label ref cite input "
    "include def newcommand renewcommand par title author abstract footnote".split()
)
MAX_PASSES = 8


@dataclass(frozen=True)
class Macro:
    n_args: int
    default: str | None  # the optional first argument's default (\newcommand{\x}[2][d]{...})
    body: str


def _read_name(text: str, pos: int) -> tuple[str, int] | None:
    pos = skip_blanks(text, pos)
    if pos < len(text) and text[pos] == "{":
        group = read_group(text, pos)
        if group is None:
            return None
        m = NAME.fullmatch(group[0].strip())
        return (m.group(1), group[1]) if m else None
    m = NAME.match(text, pos)
    return (m.group(1), m.end()) if m else None


def _parse_definition(text: str, m: re.Match, macros: dict, theorems: dict, counts: Counter) -> int:
    """Parse the definition at `m`; record it; return the index after it (m.end() if unparsable)."""
    source = m.group(0)
    if source.startswith("\\newtheorem"):
        pos = skip_blanks(text, m.end())
        env = read_group(text, pos) if text[pos : pos + 1] == "{" else None
        if env is None:
            return m.end()
        pos = skip_blanks(text, env[1])
        if text[pos : pos + 1] == "[":
            pos = skip_blanks(text, (read_bracket(text, pos) or ("", pos + 1))[1])
        title = read_group(text, pos) if text[pos : pos + 1] == "{" else None
        if title is None:
            return m.end()
        pos = skip_blanks(text, title[1])
        if text[pos : pos + 1] == "[":
            pos = (read_bracket(text, pos) or ("", pos + 1))[1]
        theorems[env[0].strip()] = " ".join(title[0].split())
        return pos
    named = _read_name(text, m.end())
    if named is None:
        counts["macros_unparsed"] += 1
        return m.end()
    name, pos = named
    n_args, default = 0, None
    if m.group(2):  # \def\name#1#2{body}: parameters must be exactly #1..#n, undelimited
        brace = text.find("{", pos)
        params = text[pos:brace] if brace >= 0 else ""
        if not re.fullmatch(r"(?:#[1-9])*", params.replace(" ", "")):
            counts["macros_skipped"] += 1
            group = read_group(text, brace) if brace >= 0 else None
            return group[1] if group else m.end()
        n_args = params.count("#")
        pos = brace
    elif source.startswith("\\DeclareMathOperator"):
        pos = skip_blanks(text, pos)
    else:
        pos = skip_blanks(text, pos)
        if text[pos : pos + 1] == "[":
            arg = read_bracket(text, pos)
            if arg is None or not arg[0].strip().isdigit():
                counts["macros_unparsed"] += 1
                return m.end()
            n_args, pos = int(arg[0]), skip_blanks(text, arg[1])
            if text[pos : pos + 1] == "[":
                arg = read_bracket(text, pos)
                if arg is None:
                    return m.end()
                default, pos = arg[0], skip_blanks(text, arg[1])
    body = read_group(text, pos) if text[pos : pos + 1] == "{" else None
    if body is None:
        counts["macros_unparsed"] += 1
        return m.end()
    value = body[0]
    if source.startswith("\\DeclareMathOperator"):
        value = f"\\operatorname{m.group(3)}{{{value}}}"
    if name in PROTECTED or UNSAFE_BODY.search(value):
        counts["macros_skipped"] += 1
    elif source.startswith("\\providecommand") and name in macros:
        pass
    else:
        macros[name] = Macro(n_args, default, value)
        counts["macros_defined"] += 1
    return body[1]


def collect_definitions(text: str, counts: Counter) -> tuple[str, dict[str, Macro], dict[str, str]]:
    """(text without definitions, macros by name, theorem environment -> printed title)."""
    macros: dict[str, Macro] = {}
    theorems: dict[str, str] = {}
    if "\\" not in text:
        return text, macros, theorems
    out, pos = [], 0
    for m in DEFINER.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        pos = _parse_definition(text, m, macros, theorems, counts)
        if pos == m.end():
            out.append(m.group(0))
    out.append(text[pos:])
    return "".join(out), macros, theorems


def _read_arg(text: str, pos: int) -> tuple[str, int] | None:
    pos = skip_blanks(text, pos)
    if pos >= len(text):
        return None
    c = text[pos]
    if c == "{":
        return read_group(text, pos)
    if c == "\\":
        m = NAME.match(text, pos)
        return (m.group(0), m.end()) if m else None
    if c in "}]":
        return None
    return c, pos + 1


def _substitute(body: str, args: list[str]) -> str:
    """Replace #1..#9 by the arguments and ## by #."""

    def param(p: re.Match) -> str:
        if p.group(1) is None:
            return "#"
        k = int(p.group(1))
        return args[k - 1] if k <= len(args) else ""

    return PARAM.sub(param, body) if "#" in body else body


def _expand_once(text: str, pattern: re.Pattern, macros: dict[str, Macro], counts: Counter) -> str:
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() < pos:
            continue  # inside arguments already consumed; the next pass sees them
        macro = macros[m.group(1)]
        args: list[str] = []
        end = m.end()
        if macro.default is not None:
            p = skip_blanks(text, end)
            opt = read_bracket(text, p) if text[p : p + 1] == "[" else None
            args.append(opt[0] if opt else macro.default)
            end = opt[1] if opt else end
        while len(args) < macro.n_args:
            arg = _read_arg(text, end)
            if arg is None:
                break
            args.append(arg[0])
            end = arg[1]
        if len(args) < macro.n_args:
            counts["macros_missing_args"] += 1
            continue
        out.append(text[pos : m.start()])
        out.append(_substitute(macro.body, args))
        pos = end
        counts["macros_expanded"] += 1
    out.append(text[pos:])
    return "".join(out)


def expand_macros(text: str, macros: dict[str, Macro], counts: Counter) -> str:
    """Expand user macros until none is left, `MAX_PASSES` passes, or the text grows 4x + 100 kB."""
    if not macros or "\\" not in text:
        return text
    names = sorted(macros, key=len, reverse=True)
    pattern = re.compile(r"\\(" + "|".join(re.escape(n) for n in names) + r")(?![a-zA-Z@])")
    budget = 4 * len(text) + 100_000
    for _ in range(MAX_PASSES):
        if not pattern.search(text):
            return text
        text = _expand_once(text, pattern, macros, counts)
        if len(text) > budget:
            counts["macros_budget_exhausted"] += 1
            return text
    if pattern.search(text):
        counts["macros_budget_exhausted"] += 1
    return text
