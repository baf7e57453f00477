"""Declarations that change how the text after them is read, held in a `Declared` state that
`latex_literal` carries left to right (and a preamble hands to its body): short verbs
(\\MakeShortVerb{\\|}), environments given a verbatim body (\\lstnewenvironment,
\\newminted, \\DefineVerbatimEnvironment, \\newtcblisting...) or dropped (the comment package's
\\excludecomment, the versions package's \\excludeversion), environments made ordinary LaTeX
again (\\includecomment, \\specialcomment, \\includeversion), and minted's \\newmint,
\\newmintinline and \\newmintedfile commands.

A declaration's arguments are read within `DECLARATION_WINDOW` characters (blanks and %
comments between them allowed), so an unclosed one costs a bounded read; past `MAX_DECLARED`
user names a declaration is ignored, so the scanner's regex stays small.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

# Environment roles: the body is shown as code, dropped, or read as ordinary LaTeX.
ROLE_CODE, ROLE_DROP, ROLE_LATEX = "code", "drop", "latex"
# Built-in verbatim-like environments: name -> (role, arguments before the body: '[' optional,
# '{' mandatory, read as TeX does). `alltt` is not one: its backslash and braces keep their meaning.
LITERAL_ENVS: dict[str, tuple[str, str]] = {
    **{name: (ROLE_CODE, "") for name in ("verbatim", "verbatim*", "spverbatim", "spverbatim*")},
    **{name: (ROLE_CODE, "[") for name in ("Verbatim", "Verbatim*", "BVerbatim", "BVerbatim*", "LVerbatim",
                                           "LVerbatim*", "lstlisting")},
    "minted": (ROLE_CODE, "[{"), "tcblisting": (ROLE_CODE, "{"), "SaveVerbatim": (ROLE_CODE, "[{"),
    "VerbatimOut": (ROLE_CODE, "[{"),  # written to a file, usually shown or \input just after
    "comment": (ROLE_DROP, ""), "filecontents": (ROLE_DROP, "[{"), "filecontents*": (ROLE_DROP, "[{"),
}
# minted's command makers -> the kind of literal span the made command opens (`latex_literal`).
COMMAND_KINDS = {"newmint": "mint", "newmintinline": "mintinline", "newmintedfile": "mintedfile"}
COMMAND_SUFFIX = {"newmint": "", "newmintinline": "inline", "newmintedfile": "file"}
# The declarations (`declare` reads each) -> the arguments after the span it makes (code run at
# \begin/\end, options): ordinary LaTeX, dropped with it by the converter.
DECLARATION_TAILS = {
    "lstnewenvironment": "{{", "specialcomment": "{{", "excludecomment": "", "includecomment": "",
    "excludeversion": "", "includeversion": "",
    **dict.fromkeys(("newminted", "newmint", "newmintinline", "newmintedfile", "DefineVerbatimEnvironment",
                     "CustomVerbatimEnvironment", "RecustomVerbatimEnvironment", "newtcblisting",
                     "renewtcblisting", "DeclareTCBListing", "NewTCBListing", "RenewTCBListing",
                     "ProvideTCBListing"), "{"),
}
DECLARATION_WINDOW = 1000
MAX_DECLARED = 64
GAP = re.compile(r"(?:\s|%[^\n]*)*+")  # blanks and comments between arguments
NAME = re.compile(r"\{\s*([^{}\\%\s]+)\s*\}")
BRACKET_NAME = re.compile(r"\[\s*([^\[\]{}\\%\s]+)\s*\]")
COUNT = re.compile(r"\[\s*([0-9])\s*\]")
OPTIONS = re.compile(r"\[(?:[^\[\]{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\]")
SPEC = re.compile(r"\{((?:[^{}]|\{[^{}]*\})*)\}")
SPEC_ITEM = re.compile(r"\s*[+!]*(?:(m)|(o)|O\{[^{}]*\})")
COMMAND_NAME = re.compile(r"[a-zA-Z@]+")


class Declared(NamedTuple):
    """The declarations in force at a point: `short`, the short-verb characters; `envs`, the
    user-declared environments as (name, role, arguments), sorted; `commands`, the commands
    made by \\newmint & co. as (name, span kind), sorted."""

    short: str = ""
    envs: tuple[tuple[str, str, str], ...] = ()
    commands: tuple[tuple[str, str], ...] = ()

    def env(self, name: str) -> tuple[str, str] | None:
        """(role, arguments) of the environment `name` here, or None when it is not declared."""
        return env_table(self.envs).get(name)


@lru_cache(maxsize=256)
def env_table(envs: tuple[tuple[str, str, str], ...]) -> dict[str, tuple[str, str]]:
    """The built-in verbatim-like environments with the user's declarations over them."""
    return {**LITERAL_ENVS, **{name: (role, args) for name, role, args in envs}}


@lru_cache(maxsize=256)
def command_table(commands: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The commands made by \\newmint & co.: name -> the kind of span each opens."""
    return dict(commands)


@lru_cache(maxsize=256)
def _by_name(items: tuple) -> dict[str, tuple]:
    return {item[0]: item[1:] for item in items}


def _updated(items: tuple, key: str, value: tuple) -> tuple:
    """`items` ((name, *value) tuples, sorted) with `key` set to `value`, unless it would hold
    more than `MAX_DECLARED` names."""
    table = _by_name(items)
    if table.get(key) == value or (key not in table and len(table) >= MAX_DECLARED):
        return items
    return tuple(sorted((k, *v) for k, v in {**table, key: value}.items()))


class _Reader:
    """Reads a declaration's arguments one after another, within the window."""

    def __init__(self, text: str, pos: int):
        self.text, self.pos = text, pos
        self.end = min(len(text), pos + DECLARATION_WINDOW)

    def take(self, pattern: re.Pattern) -> re.Match | None:
        at = GAP.match(self.text, self.pos, self.end).end()
        m = pattern.match(self.text, at, self.end)
        if m:
            self.pos = m.end()
        return m


def _arg_shape(reader: _Reader) -> str:
    """The environment arguments declared by [n][default], as \\newenvironment's."""
    count = reader.take(COUNT)
    if count is None:
        return ""
    n = int(count.group(1))
    return ("[" + "{" * (n - 1) if n else "") if reader.take(OPTIONS) else "{" * n


def _spec_shape(spec: str) -> str:
    """xparse argument spec (``O{} m``) -> shape; stops at a kind the reader does not take."""
    shape, pos = "", 0
    while m := SPEC_ITEM.match(spec, pos):
        shape += "{" if m.group(1) else "["
        pos = m.end()
    return shape


def declare(text: str, command: str, pos: int, declared: Declared) -> tuple[Declared, int] | None:
    """Read the declaration `command` whose name ends at `pos`: (the state after it, the end of
    the arguments read), or None when they do not parse."""
    r = _Reader(text, pos)
    envs, commands = declared.envs, declared.commands
    if command in COMMAND_KINDS:
        macro, lang = r.take(BRACKET_NAME), r.take(NAME)
        if lang is None:
            return None
        name = macro.group(1) if macro else lang.group(1) + COMMAND_SUFFIX[command]
        if COMMAND_NAME.fullmatch(name):
            commands = _updated(commands, name, (COMMAND_KINDS[command],))
    elif command == "newminted":
        env, lang = r.take(BRACKET_NAME), r.take(NAME)
        if lang is None:
            return None
        name = env.group(1) if env else lang.group(1) + "code"
        envs = _updated(_updated(envs, name, (ROLE_CODE, "[")), name + "*", (ROLE_CODE, "{"))
    elif command.endswith("VerbatimEnvironment"):
        name = r.take(NAME)
        base = r.take(NAME) if name else None
        if base is None:
            return None
        if (known := declared.env(base.group(1))) is not None:
            envs = _updated(envs, name.group(1), known)
    elif "tcblisting" in command or "TCBListing" in command:
        r.take(OPTIONS)  # [init options]
        name = r.take(NAME)
        if name is None:
            return None
        if command.endswith("tcblisting"):
            shape = _arg_shape(r)
        else:
            spec = r.take(SPEC)
            if spec is None:
                return None
            shape = _spec_shape(spec.group(1))
        envs = _updated(envs, name.group(1), (ROLE_CODE, shape))
    else:  # \lstnewenvironment, the comment and versions packages
        name = r.take(NAME)
        if name is None:
            return None
        if command == "lstnewenvironment":
            role, shape = ROLE_CODE, _arg_shape(r)
        else:
            role, shape = (ROLE_DROP if command.startswith("exclude") else ROLE_LATEX), ""
        envs = _updated(envs, name.group(1), (role, shape))
    return declared._replace(envs=envs, commands=commands), r.pos
