"""A LaTeX fragment as a token list, with its structure found up front: which brace closes
which, which \\end closes which \\begin, where a macro's arguments end.

Why its own: the converter (`latex_convert`) walks this list by index ranges and asks it
where things end; cutting the source into tokens (literal spans first: `latex_literal`) and
matching them up is one idea, and every question it answers stays linear on unbalanced
input (unclosed groups run to the end, stray closers are skipped).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter

from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans, Span

TOKEN = re.compile(r"(\\[a-zA-Z@]+\*?)|(\\.|\\\Z)|(\$\$?)|([{}])|([\[\]])|([~&])|([^\\{}\[\]$~&]+)", re.S)
WORD, SYMBOL, DOLLAR, BRACE, BRACKET, TIE, TEXT, LITERAL = range(1, 9)


class LatexTokens:
    """The tokens of `source` (`kind`, `val`, `start`, `end` per token; `n` of them), braces
    and environments matched; `declared`: the declarations (short verbs, verbatim-like
    environments) in force where `source` starts."""

    def __init__(self, source: str, declared: Declared = NO_DECLARATIONS):
        self.src = source
        self.kind: list[int] = []
        self.val: list[str] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.literal: dict[int, Span] = {}  # token index -> its inline literal span
        self.env_body: dict[int, Span] = {}  # start of a literal environment -> its span
        pos = 0
        self.spans = LiteralSpans(source, declared)
        for span in self.spans.spans:
            self._tokenize(pos, span.start)
            if span.kind == "env":  # \begin{name}[args], the body as one TEXT token, \end{name}
                self.env_body[span.start] = span
                self._tokenize(span.start, span.inner_start)
                self._add(TEXT, span.inner_start, span.inner_end)
                self._tokenize(span.inner_end, span.end)
            else:
                self.literal[len(self.kind)] = span
                self._add(LITERAL, span.start, span.end)
            pos = span.end
        self._tokenize(pos, len(source))
        self.n = len(self.kind)
        self.closers: dict[str, list[int]] = {}  # \) or \] -> its token indices, for `_find_symbol`
        self.stops: dict[int, int | None] = {}  # token -> the ']' a bracket walk through it stops at
        self._match_braces()
        self._match_environments()

    # --- structure -------------------------------------------------------------------------
    def _tokenize(self, start: int, end: int) -> None:
        for m in TOKEN.finditer(self.src, start, end):
            self.kind.append(m.lastindex)
            self.val.append(m.group(m.lastindex))
            self.start.append(m.start())
            self.end.append(m.end())

    def _add(self, kind: int, start: int, end: int) -> None:
        if start < end:
            self.kind.append(kind)
            self.val.append(self.src[start:end])
            self.start.append(start)
            self.end.append(end)

    def _match_braces(self) -> None:
        self.match: dict[int, int] = {}
        stack: list[int] = []
        for i, (k, v) in enumerate(zip(self.kind, self.val)):
            if k == BRACE:
                if v == "{":
                    stack.append(i)
                elif stack:
                    self.match[stack.pop()] = i
        for i in stack:
            self.match[i] = self.n

    def _env_name(self, i: int) -> tuple[str, int] | None:
        """Name in `\\begin{name}` / `\\end{name}` at token i, and the token index after it."""
        j = i + 1
        if j < self.n and self.kind[j] == TEXT and not self.val[j].strip():
            j += 1
        if j + 2 < self.n and self.val[j] == "{" and self.kind[j + 1] == TEXT and self.val[j + 2] == "}":
            return self.val[j + 1].strip(), j + 3
        return None

    def _match_environments(self) -> None:
        self.env_end: dict[int, int] = {}
        stack: list[tuple[str, int]] = []
        open_names: Counter = Counter()  # names on the stack: an \end of no open one is skipped in O(1)
        for i in range(self.n):
            if self.kind[i] != WORD or self.val[i] not in ("\\begin", "\\end"):
                continue
            named = self._env_name(i)
            if named is None:
                continue
            if self.val[i] == "\\begin":
                stack.append((named[0], i))
                open_names[named[0]] += 1
            elif open_names[named[0]]:
                while stack:
                    name, b = stack.pop()
                    open_names[name] -= 1
                    self.env_end[b] = i
                    if name == named[0]:
                        break

    # --- argument helpers --------------------------------------------------------------------
    def _next(self, i: int) -> int:
        """Index of the next token that is not a blank text run (no blank line crossed)."""
        while i < self.n and self.kind[i] == TEXT and not self.val[i].strip() and self.val[i].count("\n") < 2:
            i += 1
        return i

    def _bracket_end(self, i: int) -> int | None:
        """For '[' at i: index of its ']' at brace depth 0, None when a blank line or the end comes
        first. Remembered: the stop found from each token walked holds for every '[' whose walk
        reaches that token, so a run of unclosed \\item[ in one paragraph stays linear."""
        k, walked = i + 1, []
        while k < self.n and k not in self.stops:
            walked.append(k)
            if self.kind[k] == BRACE and self.val[k] == "{":
                k = self.match[k] + 1
            elif (self.val[k] == "]" and self.kind[k] == BRACKET) or (
                self.kind[k] == TEXT and self.val[k].count("\n") >= 2
            ):
                break
            else:
                k += 1
        stop = self.stops.get(k, k if k < self.n and self.kind[k] == BRACKET else None)
        for w in walked:
            self.stops[w] = stop
        return stop

    def _skip_args(self, i: int, shape: str) -> int:
        for c in shape:
            j = self._next(i)
            if j >= self.n:
                return j
            if c == "[" and self.val[j] == "[" and self.kind[j] == BRACKET:
                close = self._bracket_end(j)
                if close is not None:
                    i = close + 1
            elif c == "{":
                if self.val[j] == "{" and self.kind[j] == BRACE:
                    i = self.match[j] + 1
                elif self.kind[j] in (WORD, SYMBOL) or (self.kind[j] == TEXT and len(self.val[j]) == 1):
                    i = j + 1
        return i

    # --- searches ------------------------------------------------------------------------------
    def _find(self, i: int, j: int, kind: int, value: str) -> int | None:
        for k in range(i, j):
            if self.kind[k] == kind and self.val[k] == value:
                return k
            if kind == DOLLAR and self.kind[k] == TEXT and self.val[k].count("\n") >= 2:
                return None  # TeX forbids a paragraph break inside $...$
        return None

    def _find_symbol(self, i: int, j: int, value: str) -> int | None:
        """First `value` symbol token in [i, j): a bisect, so unclosed \\( runs stay linear."""
        if value not in self.closers:
            self.closers[value] = [k for k in range(self.n) if self.kind[k] == SYMBOL and self.val[k] == value]
        at = self.closers[value]
        k = bisect.bisect_left(at, i)
        return at[k] if k < len(at) and at[k] < j else None
