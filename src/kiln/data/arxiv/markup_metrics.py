"""Quality measures of extracted text: leaked LaTeX markup outside math, and math kept.

Leaked markup: after removing ``` code fences, `inline code` spans (the converter's rendering of
\\verb, \\lstinline..., kept as written on purpose) and math spans, the fraction of whitespace words
that start with a backslash or contain a brace. Math spans: $..$, $$..$$, \\(..\\), \\[..\\] and the
display environments of `latex_rules.MATH_ENVS`.
"""

from __future__ import annotations

import re

from kiln.data.arxiv.latex_rules import MATH_ENVS

_ENV_NAMES = "|".join(sorted((re.escape(e) for e in MATH_ENVS), key=len, reverse=True))
MATH_SPAN = re.compile(
    r"(?<!\\)\$\$.+?(?<!\\)\$\$"
    r"|(?<![\\$])\$(?!\$)(?:[^$\\]|\\.)+?\$"
    r"|\\\(.+?\\\)|\\\[.+?\\\]"
    rf"|\\begin\{{({_ENV_NAMES})\}}.*?\\end\{{\1\}}",
    re.S,
)
CODE_FENCE = re.compile(r"^```\n.*?\n```$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")  # a ` outside code is rare: the converter writes TeX's `x' as 'x'


def count_math_spans(text: str) -> int:
    return sum(1 for _ in MATH_SPAN.finditer(text))


def leaked_markup(text: str) -> tuple[int, int]:
    """(leaked words, words) outside code (``` fences, `inline` spans) and math."""
    prose = MATH_SPAN.sub(" ", INLINE_CODE.sub(" ", CODE_FENCE.sub(" ", text)))
    words = prose.split()
    leaked = sum(1 for w in words if w.startswith("\\") or "{" in w or "}" in w)
    return leaked, len(words)
