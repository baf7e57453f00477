"""Quality measures of extracted text: leaked LaTeX markup outside math, and math kept.

Leaked markup: after removing ``` code fences, `inline code` spans (the converter's rendering of
\\verb, \\lstinline..., kept as written on purpose) and math spans, the fraction of whitespace words
that start with a backslash or contain a brace. Math spans: $..$, $$..$$, \\(..\\), \\[..\\] and the
display environments of `latex_rules.MATH_ENVS`.
"""

from __future__ import annotations

import bisect
import re

from kiln.data.arxiv.latex_rules import MATH_ENVS

_ENV_NAMES = "|".join(sorted((re.escape(e) for e in MATH_ENVS), key=len, reverse=True))
# the math span's alternatives: MATH_SPAN is them joined; `strip_math_spans` tries each where
# it may start
_ALTS = (r"(?<!\\)\$\$.+?(?<!\\)\$\$", r"(?<![\\$])\$(?!\$)(?:[^$\\]|\\.)+?\$",
         r"\\\(.+?\\\)", r"\\\[.+?\\\]", rf"\\begin\{{({_ENV_NAMES})\}}.*?\\end\{{\1\}}")
_DOLLARS, _DOLLAR, _PAREN, _BRACKET, _ENVIRONMENT = (re.compile(a, re.S) for a in _ALTS)
# `$..$` within a paragraph: TeX allows no blank line in inline math, so a `$` pair across
# one is two literal dollars (a web page's prices, the latex stage's `$` for `\$`)
_DOLLAR_IN_PARAGRAPH = re.compile(r"(?<![\\$])\$(?!\$)(?:[^$\\\n]|\\.|\n(?![ \t\r]*\n))+?\$",
                                  re.S)
_BEGIN = re.compile(rf"\\begin\{{({_ENV_NAMES})\}}")
_OPENER = re.compile(r"\$|\\[(\[]|\\begin\{")
MATH_SPAN = re.compile("|".join(_ALTS), re.S)

CODE_FENCE = re.compile(r"^```\n.*?\n```$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")  # a ` outside code is rare: the converter writes TeX's `x' as 'x'


def count_math_spans(text: str) -> int:
    return sum(1 for _ in MATH_SPAN.finditer(text))


def leaked_markup(text: str) -> tuple[int, int]:
    """(leaked words, words) outside code (``` fences, `inline` spans) and math."""
    prose = strip_math_spans(INLINE_CODE.sub(" ", CODE_FENCE.sub(" ", text)))
    words = prose.split()
    leaked = sum(1 for w in words if w.startswith("\\") or "{" in w or "}" in w)
    return leaked, len(words)


def strip_math_spans(text: str, inline_in_paragraph: bool = False) -> str:
    """`MATH_SPAN.sub(" ", text)`, the same spans replaced, in time linear in the text: the
    regex's lazy `.+?` runs to the end of the text for each opener that has no closer after
    it (`\\(` in a regex, an unclosed `\\[`), so 100,000 characters of such text took seconds.
    Here an alternative whose closer does not come later is not tried: the closers' places
    are listed once, and each alternative that has one is matched by its own regex.
    `inline_in_paragraph`: a `$..$` span never crosses a blank line (display spans still
    may: the converter leaves blank lines where it drops a `\\label` line)."""
    dollar = _DOLLAR_IN_PARAGRAPH if inline_in_paragraph else _DOLLAR
    closers: dict[str, list[int]] = {}

    def closer_from(needle: str, start: int) -> bool:
        places = closers.get(needle)
        if places is None:  # every place the alternative's closer matches (overlapping too)
            guard = r"(?<!\\)" if needle == "$$" else ""
            places = closers[needle] = [m.start() for m in re.finditer(
                guard + "(?=" + re.escape(needle) + ")", text)]
        i = bisect.bisect_left(places, start)
        return i < len(places)

    out, done, pos = [], 0, 0
    while (opener := _OPENER.search(text, pos)) is not None:
        p, m = opener.start(), None
        if text.startswith("$$", p):
            if closer_from("$$", p + 3):  # `.+?`: one character at least between
                m = _DOLLARS.match(text, p)
        if m is None and text.startswith("$", p):
            m = dollar.match(text, p)  # stops at the next `$`: no lazy run to the end
        if m is None and text.startswith("\\(", p) and closer_from("\\)", p + 3):
            m = _PAREN.match(text, p)
        if m is None and text.startswith("\\[", p) and closer_from("\\]", p + 3):
            m = _BRACKET.match(text, p)
        if m is None and (begin := _BEGIN.match(text, p)) is not None:
            if closer_from(f"\\end{{{begin[1]}}}", begin.end()):
                m = _ENVIRONMENT.match(text, p)
        if m is None:
            pos = p + 1
            continue
        out += [text[done:p], " "]
        done = pos = m.end()
    out.append(text[done:])
    return "".join(out)
