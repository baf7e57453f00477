"""User macros: collect \\newcommand/\\renewcommand/\\providecommand/\\def/\\DeclareMathOperator
(and xparse's \\NewDocumentCommand & co. where their argument spec is \\newcommand's: m, O{..}),
environments (\\newenvironment, \\renewenvironment, \\provideenvironment, xparse's
\\NewDocumentEnvironment & co.) and \\let aliases, and expand them in text and math, with #1..#9
arguments and \\newcommand's optional default; \\provide* defines only a name not defined yet
(`builtin_command`). \\let\\new\\old copies \\old's meaning when it is a user macro defined
before, else makes \\new write \\old (\\let\\eps\\varepsilon); such an alias is dropped once
\\old itself is user-defined, as then it meant the built-in \\old, which text cannot say. Where
each of the body's definitions holds is `latex_scopes`' business.

Not TeX: expansion is textual, in whole-document passes (a macro used inside another's body is
expanded by the next pass), at most `MAX_PASSES` passes and a growth budget checked as each pass
writes, so a recursive ``\\def\\a{\\a x}`` or a body repeating a long argument stops early.
Literal spans (\\verb, \\url, \\lstinline..., verbatim environments) are neither scanned for
definitions nor expanded, nor do their braces count in an argument; `\\\\x` is a line break then
x, not \\x. Skipped (counted):
delimited \\def parameters, bodies that define macros or use \\csname/\\expandafter,
redefinitions of structural names (\\begin, \\section...) and of the environments the converter
reads itself (\\renewenvironment{abstract}, {figure}, {thebibliography}...: expanded, the paper's
code would hide what it drops or keeps).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from kiln.data.arxiv.latex_declared import LITERAL_ENVS
from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans
from kiln.data.arxiv.latex_rules import (
    CODE_ENVS,
    DROP,
    DROP_ENVS,
    ENV_ARGS,
    HEADING_ENVS,
    HEADINGS,
    LINE_ENVS,
    LIST_ENVS,
    MATH_ENVS,
    TEXT_SYMBOLS,
    THEOREMS,
    known_env,
    known_macro,
)
from kiln.data.arxiv.latex_source import read_bracket, read_group, skip_blanks

DEFINER = re.compile(
    r"\\(?:(re)?newcommand|providecommand|DeclareRobustCommand|([gex]?def)|"
    r"DeclareMathOperator|newtheorem|(?:re)?newenvironment|provideenvironment|let|"
    r"(?:New|Renew|Provide|Declare)Document(?:Command|Environment))"
    r"(?![a-zA-Z@])(\*?)"
)
NAME = re.compile(r"\\([a-zA-Z@]+|.)")
DEF_PARAMS = re.compile(r"[ ]*(?:#[ ]*[1-9][ ]*)*")  # undelimited \def parameters, spaces allowed
PARAM = re.compile(r"##|#([1-9])")
UNSAFE_BODY = re.compile(r"\\(?:[gex]?def|newcommand|renewcommand|let|csname|expandafter|futurelet|@ifnextchar)(?![a-zA-Z@])")
PROTECTED = frozenset(
    "begin end item section subsection subsubsection paragraph chapter part label ref cite input "
    "include def newcommand renewcommand par title author abstract footnote".split()
)
MAX_PASSES = 8
# the prefix that makes a definition global, other prefixes between (LyX writes \\global\\long\\def)
GLOBAL_BEFORE = re.compile(r"\\global\s*(?:\\(?:long|protected|outer)(?![a-zA-Z@])\s*)*\Z")
ENV_NAME = re.compile(r"[a-zA-Z@*]+")
# begin code that reads the body as verbatim (moreverb's \verbatimwrite, \comment, listings):
# expanded, its file name came out as text and the body as LaTeX, so the environment stays unknown
VERBATIM_CODE = re.compile(r"\\(?:[a-zA-Z]*[vV]erbatim[a-zA-Z]*|comment|lst[a-zA-Z]*|minted)(?![a-zA-Z@])"
                           r"|\\begin\s*\{(?:[a-zA-Z]*[vV]erbatim|lstlisting|minted|comment)")
# \let's target after the name: blanks, an optional = and one optional space, then one token
LET_TARGET = re.compile(r"\s*(?:=[ ]?)?(?:\\([a-zA-Z@]+|[^a-zA-Z@])|([^\\{}%\s]))")
CONDITIONAL_WORDS = frozenset({"fi", "else", "or", "csname", "endcsname"})
# The environments `latex_convert` reads itself (drops, keeps as math or code, titles): a paper's
# \renewenvironment of one (journal styles redo abstract, thebibliography, figure) is not expanded
CONVERTER_ENVS = frozenset({"document", *MATH_ENVS, *DROP_ENVS, *LIST_ENVS, *CODE_ENVS, *LINE_ENVS,
                            *LITERAL_ENVS, *THEOREMS, *HEADING_ENVS, *ENV_ARGS})
# LaTeX's own environments that no list above names: \provideenvironment leaves them as they are
LATEX_ENVS = frozenset({"quote", "quotation", "verse", "center", "flushleft", "flushright", "minipage",
                        "tabbing", "trivlist", "titlepage", "proof"})


def builtin_command(name: str) -> bool:
    """Whether LaTeX or a common package defines `name` as far as the converter knows (its own
    rules, pylatexenc's macro database): \\providecommand then leaves it as it is."""
    return (name in PROTECTED or name in DROP or name in HEADINGS or name in TEXT_SYMBOLS
            or known_macro(name))


def builtin_env(name: str) -> bool:
    """Whether the environment `name` is defined before any paper's code, as far as the converter
    knows: \\provideenvironment then leaves it as it is."""
    return name in CONVERTER_ENVS or name in LATEX_ENVS or known_env(name)


@dataclass(frozen=True)
class Macro:
    n_args: int
    default: str | None  # the optional first argument's default (\newcommand{\x}[2][d]{...})
    body: str
    builtin: str | None = None  # \let\new\old with \old not a user macro then: "old"


class Definition(NamedTuple):
    """A definition `collect_definitions` met: where it stood in the text it returns, the macro's
    key, its meaning, and whether it is global (\\gdef, \\xdef, \\global\\def...): what
    `latex_scopes` needs to say where it holds."""

    pos: int
    name: str
    macro: Macro
    is_global: bool


class _Recording(dict):
    """A macro table that lists the names assigned in it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[str] = []

    def __setitem__(self, name: str, macro: Macro) -> None:
        super().__setitem__(name, macro)
        self.assigned.append(name)


def _read_name(text: str, pos: int, spans: LiteralSpans) -> tuple[str, int] | None:
    pos = skip_blanks(text, pos)
    if pos < len(text) and text[pos] == "{":
        group = read_group(text, pos, spans)
        if group is None:
            return None
        m = NAME.fullmatch(group[0].strip())
        return (m.group(1), group[1]) if m else None
    m = NAME.match(text, pos)
    return (m.group(1), m.end()) if m else None


def _parse_environment(text: str, m: re.Match, macros: dict, counts: Counter, spans: LiteralSpans, known: dict) -> int:
    """Record \\newenvironment{name}[n][default]{begin code}{end code} (\\renewenvironment, and
    xparse's \\NewDocumentEnvironment{name}{spec}{begin code}{end code} alike) as two macros,
    ``begin{name}`` (taking the arguments) and ``end{name}``, so that a paper's own environment
    reads as its code says (`\\begin{myquote}{Knuth}` printed 'Knuth' as body text before).
    Skipped (counted), the definition still removed: an xparse spec \\newcommand could not write
    (``m O{x}``, ``+b``), xparse end code using the arguments, and a redefinition of an
    environment the converter reads itself (`CONVERTER_ENVS`). \\provideenvironment (xparse's
    \\ProvideDocumentEnvironment) defines only an environment not defined yet: not one of the
    paper's before it, nor one LaTeX or the converter knows (`builtin_env`)."""
    source = m.group(0)
    pos = skip_blanks(text, m.end())
    name = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
    if name is None or not ENV_NAME.fullmatch(name[0].strip()):
        counts["macros_unparsed"] += 1
        return m.end()
    xparse = source.endswith("DocumentEnvironment")
    shape: tuple[int, str | None] | None = None
    if xparse:
        pos = skip_blanks(text, name[1])
        spec = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
        if spec is None:
            counts["macros_unparsed"] += 1
            return m.end()
        shape = _xparse_shape(spec[0])
        arguments = (*(shape or (0, None)), skip_blanks(text, spec[1]))
    else:
        arguments = _arguments(text, name[1], spans)
    if arguments is None:
        counts["macros_unparsed"] += 1
        return m.end()
    n_args, default, pos = arguments
    begin = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
    pos = skip_blanks(text, begin[1]) if begin else pos
    end = read_group(text, pos, spans) if begin and text[pos : pos + 1] == "{" else None
    if begin is None or end is None:
        counts["macros_unparsed"] += 1
        return m.end()
    env = name[0].strip()
    redefines = not source.startswith(("\\newenvironment", "\\NewDocumentEnvironment"))
    if source.startswith(("\\provideenvironment", "\\ProvideDocumentEnvironment")) and (
        f"begin{{{env}}}" in macros or f"begin{{{env}}}" in known or builtin_env(env)
    ):
        pass
    elif (
        (xparse and (shape is None or any(p.group(1) for p in PARAM.finditer(end[0]))))
        or (redefines and env in CONVERTER_ENVS)
        or UNSAFE_BODY.search(begin[0]) or UNSAFE_BODY.search(end[0]) or VERBATIM_CODE.search(begin[0])
    ):
        counts["macros_skipped"] += 1
    else:
        macros[f"begin{{{env}}}"] = Macro(n_args, default, begin[0])
        macros[f"end{{{env}}}"] = Macro(0, None, end[0])
        counts["macros_defined"] += 1
    return end[1]


def _parse_let(text: str, name: str, pos: int, macros: dict, counts: Counter, known: dict) -> int:
    """Record \\let\\name<target> (`pos`: after the name); the index after it, or where the
    name ended when it does not parse (a brace target, \\let\\csname..., a conditional:
    \\let\\ifdraft\\iffalse is `latex_conditionals`' business)."""
    m = LET_TARGET.match(text, pos)
    if m is None or name in CONDITIONAL_WORDS or name.startswith("if"):
        counts["macros_skipped"] += 1
        return pos
    target = m.group(1)
    if target is not None and (target in CONDITIONAL_WORDS or target.startswith("if")):
        counts["macros_skipped"] += 1
        return pos
    if name in PROTECTED:
        counts["macros_skipped"] += 1
        return m.end()
    if target is None:
        macros[name] = Macro(0, None, m.group(2))
    elif target in macros or target in known:
        macros[name] = macros.get(target) or known[target]
    else:
        macros[name] = Macro(0, None, "\\" + target, builtin=target)
    counts["macros_defined"] += 1
    return m.end()


def _parse_definition(
    text: str, m: re.Match, macros: dict, theorems: dict, counts: Counter, spans: LiteralSpans, known: dict
) -> int:
    """Parse the definition at `m`; record it; return the index after it (m.end() if unparsable).
    Arguments are read around the literal spans `spans` (of `text`); `known`: the macros defined
    before `text` (what a \\let there copies)."""
    source = m.group(0)
    if "nvironment" in source:  # \newenvironment, \renewenvironment, \NewDocumentEnvironment...
        return _parse_environment(text, m, macros, counts, spans, known)
    if source.startswith("\\newtheorem"):
        pos = skip_blanks(text, m.end())
        env = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
        if env is None:
            return m.end()
        pos = skip_blanks(text, env[1])
        if text[pos : pos + 1] == "[":
            pos = skip_blanks(text, (read_bracket(text, pos, spans) or ("", pos + 1))[1])
        title = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
        if title is None:
            return m.end()
        pos = skip_blanks(text, title[1])
        if text[pos : pos + 1] == "[":
            pos = (read_bracket(text, pos, spans) or ("", pos + 1))[1]
        theorems[env[0].strip()] = " ".join(title[0].split())
        return pos
    named = _read_name(text, m.end(), spans)
    if named is None:
        counts["macros_unparsed"] += 1
        return m.end()
    name, pos = named
    if source == "\\let":
        return _parse_let(text, name, pos, macros, counts, known)
    n_args, default = 0, None
    if m.group(2):  # \def\name#1#2{body}: parameters must be exactly #1..#n, undelimited
        brace = spans.find("{", pos)  # remembered: a run of \def\x#1 with no { after stays linear
        if brace < 0:
            counts["macros_unparsed"] += 1
            return m.end()
        if DEF_PARAMS.match(text, pos).end() != brace:
            counts["macros_skipped"] += 1
            group = read_group(text, brace, spans)
            return group[1] if group else m.end()
        n_args = text.count("#", pos, brace)
        pos = brace
    elif source.startswith("\\DeclareMathOperator"):
        pos = skip_blanks(text, pos)
    elif source.endswith("DocumentCommand"):  # xparse: {\name}{arg spec}{body}
        pos = skip_blanks(text, pos)
        spec = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
        if spec is None:
            counts["macros_unparsed"] += 1
            return m.end()
        pos = skip_blanks(text, spec[1])
        if (shape := _xparse_shape(spec[0])) is None:  # s, o, r, v...: not a textual macro
            counts["macros_skipped"] += 1
            group = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
            return group[1] if group else m.end()
        n_args, default = shape
    else:
        arguments = _arguments(text, pos, spans)
        if arguments is None:
            counts["macros_unparsed"] += 1
            return m.end()
        n_args, default, pos = arguments
    body = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
    if body is None:
        counts["macros_unparsed"] += 1
        return m.end()
    value = body[0]
    if source.startswith("\\DeclareMathOperator"):
        value = f"\\operatorname{m.group(3)}{{{value}}}"
    if name in PROTECTED or UNSAFE_BODY.search(value):
        counts["macros_skipped"] += 1
    elif source.startswith(("\\providecommand", "\\ProvideDocumentCommand")) and (
        name in macros or name in known or builtin_command(name)
    ):
        pass  # \\provide* defines only a name not defined yet
    else:
        macros[name] = Macro(n_args, default, value)
        counts["macros_defined"] += 1
    return body[1]


def _arguments(text: str, pos: int, spans: LiteralSpans) -> tuple[int, str | None, int] | None:
    """The `[n][default]` of \\newcommand and \\newenvironment after the name (`pos`), both
    optional: (n, the first argument's default or None, the index after them), or None where
    they do not parse (an unclosed bracket, a count that is no number)."""
    pos = skip_blanks(text, pos)
    if text[pos : pos + 1] != "[":
        return 0, None, pos
    arg = read_bracket(text, pos, spans)
    if arg is None or not arg[0].strip().isdigit():
        return None
    n_args, pos = int(arg[0]), skip_blanks(text, arg[1])
    if text[pos : pos + 1] != "[":
        return n_args, None, pos
    arg = read_bracket(text, pos, spans)
    return None if arg is None else (n_args, arg[0], skip_blanks(text, arg[1]))


XPARSE_SPEC = re.compile(r"\s*(?:O\s*\{([^{}]*)\})?((?:\s*\+?m)*)\s*")


def _xparse_shape(spec: str) -> tuple[int, str | None] | None:
    """(arguments, default of the optional first) of an xparse argument spec that
    \\newcommand could write (``m m``, ``O{x} m``), else None."""
    m = XPARSE_SPEC.fullmatch(spec)
    if m is None:
        return None
    return m.group(2).count("m") + (m.group(1) is not None), m.group(1)


def collect_definitions(
    text: str,
    counts: Counter,
    declared: Declared = NO_DECLARATIONS,
    spans: LiteralSpans | None = None,
    known: dict[str, Macro] | None = None,
    definitions: list[Definition] | None = None,
) -> tuple[str, dict[str, Macro], dict[str, str]]:
    """(text without definitions, macros by name, theorem environment -> printed title);
    `declared`: the declarations (short verbs, verbatim-like environments) in force where `text`
    starts; `spans`: the literal spans of `text`, when the caller has read them (else they are read
    here, with `declared`, if a definition is met); `known`: the macros defined before `text`
    (a local package's, for the preamble), which a \\let in it may copy; `definitions`, when
    given, gets each definition recorded, in order, with where it stood (`latex_scopes`)."""
    macros: dict[str, Macro] = _Recording() if definitions is not None else {}
    written = 0  # characters in `out`
    theorems: dict[str, str] = {}
    if "\\" not in text:
        return text, macros, theorems
    out, pos = [], 0
    for m in DEFINER.finditer(text):
        if m.start() < pos:
            continue
        if spans is None:
            spans = LiteralSpans(text, declared)
        if m.start() in spans:
            continue
        out.append(text[pos : m.start()])
        written += m.start() - pos
        start = pos
        pos = _parse_definition(text, m, macros, theorems, counts, spans, known or {})
        if pos == m.end():
            out.append(m.group(0))
            written += len(m.group(0))
        elif _starts_with_letter(text, pos) and _ends_with_control_word(text, m.start()):
            out.append(" ")  # \\noindent\\def\\x{y}Hello: \\noindent then Hello, not \\noindentHello
            written += 1
        if definitions is not None and macros.assigned:
            is_global = m.group(2) in ("gdef", "xdef") or GLOBAL_BEFORE.search(text, max(start, m.start() - 24), m.start())
            definitions.extend(Definition(written, name, macros[name], bool(is_global)) for name in macros.assigned)
            macros.assigned.clear()
    out.append(text[pos:])
    return "".join(out), dict(macros), theorems


def _read_arg(text: str, pos: int, spans: LiteralSpans) -> tuple[str, int] | None:
    pos = skip_blanks(text, pos)
    if pos >= len(text):
        return None
    c = text[pos]
    if c == "{":
        return read_group(text, pos, spans)
    if c == "\\":
        m = NAME.match(text, pos)
        return (m.group(0), m.end()) if m else None
    if c in "}]":
        return None
    return c, pos + 1


class _OverBudget(Exception):
    """A pass would write more than its budget; raised from inside a substitution."""


def _ends_with_control_word(text: str, end: int) -> bool:
    """Whether text[:end] ends with a control word (\\alpha, not the line break then a: \\\\a)."""
    j = end
    while j > 0 and (text[j - 1].isascii() and text[j - 1].isalpha() or text[j - 1] == "@"):
        j -= 1
    if j == end:
        return False
    k = j
    while k > 0 and text[k - 1] == "\\":
        k -= 1
    return (j - k) % 2 == 1


def _starts_with_letter(text: str, at: int = 0) -> bool:
    return at < len(text) and (text[at].isascii() and text[at].isalpha() or text[at] == "@")


def _substitute(body: str, args: list[str], room: int) -> str:
    """Replace #1..#9 by the arguments and ## by #; raise `_OverBudget` past `room` characters.
    TeX read the body and the arguments as tokens: a control word next to a letter across the
    join (\\lvert#1 with x, #1x with \\alpha) gets a space, else it would read \\lvertx."""
    if "#" not in body:
        if len(body) > room:
            raise _OverBudget
        return body
    size = len(body)
    pieces: list[str] = []
    pos = 0
    for p in PARAM.finditer(body):
        pieces.append(body[pos : p.start()])
        pos = p.end()
        if p.group(1) is None:
            pieces.append("#")
            continue
        k = int(p.group(1))
        arg = args[k - 1] if k <= len(args) else ""
        if _starts_with_letter(arg) and _ends_with_control_word(_last(pieces), len(_last(pieces))):
            arg = " " + arg
        size += len(arg)
        if size > room:
            raise _OverBudget
        pieces.append(arg)
    if _starts_with_letter(body, pos) and _ends_with_control_word(_last(pieces), len(_last(pieces))):
        pieces.append(" ")
    pieces.append(body[pos:])
    return "".join(pieces)


def _last(pieces: list[str]) -> str:
    """The last nonempty piece written, or ""."""
    return next((piece for piece in reversed(pieces) if piece), "")


def _expand_once(
    text: str, pattern: re.Pattern, macros: dict[str, Macro], counts: Counter, budget: int, declared: Declared
) -> tuple[str, int] | None:
    """One pass over `text`: (new text, macros expanded), or None once the output would pass
    `budget` characters (checked as it is written: one pass can multiply the text)."""
    out, pos, size, n, spans = [], 0, 0, 0, None
    for m in pattern.finditer(text):
        start = m.start()
        if m.group(1) is None or start < pos:
            continue  # a `\\` pair, or inside arguments already consumed (the next pass sees them)
        if spans is None:
            spans = LiteralSpans(text, declared)
        if start in spans:
            continue
        macro = macros[_key(m.group(1))]
        args: list[str] = []
        end = m.end()
        if macro.default is not None:
            p = skip_blanks(text, end)
            opt = read_bracket(text, p, spans) if text[p : p + 1] == "[" else None
            args.append(opt[0] if opt else macro.default)
            end = opt[1] if opt else end
        while len(args) < macro.n_args:
            arg = _read_arg(text, end, spans)
            if arg is None:
                break
            args.append(arg[0])
            end = arg[1]
        if len(args) < macro.n_args:
            counts["macros_missing_args"] += 1
            continue
        out.append(text[pos:start])
        size += start - pos
        try:
            expanded = _substitute(macro.body, args, budget - size)
        except _OverBudget:
            return None
        if _starts_with_letter(text, end) and _ends_with_control_word(expanded, len(expanded)):
            expanded += " "  # \\newcommand{\\f}[1]{#1\\alpha}: \\f{x}y is \\alpha then y
        if _starts_with_letter(expanded) and _ends_with_control_word(last := _last(out), len(last)):
            expanded = " " + expanded  # \\noindent\\name is \\noindent then the name, not \\noindentJohn
        out.append(expanded)
        size += len(expanded)
        pos = end
        n += 1
    out.append(text[pos:])
    counts["macros_expanded"] += n
    return "".join(out), n


def _pattern(names: list[str]) -> re.Pattern:
    """`\\name` for one of `names` (group 1), or a `\\\\` pair (no group) so that `\\\\x` reads as
    a line break then x. Longest names first, and no letter after, so `\\ab` is not `\\a`."""
    names = sorted(names, key=len, reverse=True)
    return re.compile(r"\\(?:\\|(" + "|".join(_name_pattern(n) for n in names) + "))")


def _name_pattern(name: str) -> str:
    """A macro name, no letter after; an environment's ``begin{x}`` / ``end{x}`` with the blanks
    TeX allows before its brace."""
    if "{" not in name:
        return re.escape(name) + "(?![a-zA-Z@])"
    command, env = name.rstrip("}").split("{", 1)
    return rf"{command}\s*\{{{re.escape(env)}\}}"


def _key(used: str) -> str:
    """The macros' key of a use matched by `_pattern`: `begin {x}` is ``begin{x}``."""
    return used if "{" not in used else "".join(used.split())


def _has_use(text: str, pattern: re.Pattern, declared: Declared) -> bool:
    """Whether `text` uses a macro outside literal spans."""
    spans = None
    for m in pattern.finditer(text):
        if m.group(1) is not None:
            if spans is None:
                spans = LiteralSpans(text, declared)
            if m.start() not in spans:
                return True
    return False


def expand_macros(
    text: str, macros: dict[str, Macro], counts: Counter, declared: Declared = NO_DECLARATIONS
) -> str:
    """Expand user macros until none is left, `MAX_PASSES` passes, or the text would grow past
    4x + 100 kB (then the last complete pass is returned); `declared`: the declarations (short
    verbs, verbatim-like environments) in force where `text` starts (none is expanded inside a
    literal span)."""
    macros = {name: macro for name, macro in macros.items() if macro.builtin not in macros}
    if not macros or "\\" not in text:
        return text
    pattern = _pattern(list(macros))
    budget = 4 * len(text) + 100_000
    for _ in range(MAX_PASSES):
        done = _expand_once(text, pattern, macros, counts, budget, declared)
        if done is None:
            counts["macros_budget_exhausted"] += 1
            return text
        if not done[1]:
            return text  # none left, or only literal (\\verb...) or argument-less uses
        text = done[0]
    if _has_use(text, pattern, declared):
        counts["macros_budget_exhausted"] += 1
    return text
