"""LaTeX body -> plain text with Markdown headings and LaTeX math, one pass over a token list.

Tokens come from one regex (control words/symbols, $, braces, brackets, text runs); braces and
environments are matched up front (`latex_tokens`), so nesting is handled by index ranges, not
by regexes, and walked with an explicit stack, not recursion, so any depth converts. Literal spans
(`latex_literal`) are cut out first: an inline one (\\verb, \\url, a short verb...) is one LITERAL
token and a verbatim-like environment's body one TEXT token, so no brace or \\end inside them is
read as LaTeX; an environment is read as the declarations in force at its \\begin say
(`latex_declared`: a user's \\lstnewenvironment is code, an \\excludecomment one is dropped).
Math is copied from the source verbatim. Unbalanced input degrades (stray closers skipped,
unclosed groups run to the end) instead of failing. See `latex_rules` for what happens to each
construct.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from kiln.data.arxiv.latex_declared import DECLARATION_TAILS, ROLE_CODE, ROLE_DROP, ROLE_LATEX
from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared
from kiln.data.arxiv.latex_references import (
    DROPPED_REFERENCE,
    HINT,
    read_reference_nouns,
    reference_hint,
)
from kiln.data.arxiv.latex_rules import (
    ACCENT_WORDS,
    ACCENTS,
    CODE_ENVS,
    DROP,
    DROP_ENVS,
    HEADING_ENVS,
    HEADINGS,
    LINE_ENVS,
    LIST_ENVS,
    LITERAL_BLOCK,
    LITERAL_CODE,
    LITERAL_TEXT,
    MATH_ENVS,
    REFERENCES,
    RUN_IN_HEADINGS,
    THEOREMS,
    accent_text,
    env_args,
    macro_args,
    symbol_text,
)
from kiln.data.arxiv.latex_tokens import (
    BRACE,
    BRACKET,
    DOLLAR,
    LITERAL,
    SYMBOL,
    TEXT,
    TIE,
    WORD,
    LatexTokens,
)
from kiln.data.arxiv.latex_units import SI_COMMANDS, SI_LISTS, si_items, si_unit

LABEL = re.compile(r"\\label\s*\{[^{}]*\}")
BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")
SPACES = re.compile(r"[ \t\r\f\v]+")
SPACING_SYMBOLS = {" ": " ", ",": " ", ";": " ", ":": " ", "\n": " ", "\t": " "}
SILENT_SYMBOLS = frozenset("!-/@<>|")
# the references that print their kind ("Theorem 3"), and those of them that name a range or only
# the kind: read as it by `latex_references`
CLEVER_REFERENCES = frozenset({"cref", "Cref", "autoref", "Autoref", "vref", "Vref", "zcref", "crefrange", "Crefrange",
                               "vrefrange", "namecref", "nameCref", "lcnamecref", "namecrefs", "nameCrefs", "lcnamecrefs"})
PLURAL_REFERENCES = frozenset({"crefrange", "Crefrange", "vrefrange", "namecrefs", "nameCrefs", "lcnamecrefs"})
# A heading's title, a label or an alltt body is converted apart, then joined into the text around
# it: one nested in MAX_CAPTURES others is read in line instead, so that no text is joined more
# than that many times (nested without bound, the joins are quadratic).
MAX_CAPTURES = 8
# A stretch of tokens to convert: [start, end), the list it writes to, what to call when done.
Frame = tuple[int, int, list[str], Callable[[], None] | None]


def _fix_text(t: str) -> str:
    """TeX's dash and quote ligatures; a lone ` (an opening single quote) becomes ', so that a
    backtick in the output marks code."""
    if "-" in t or "`" in t or "'" in t:
        t = t.replace("---", "—").replace("--", "–").replace("``", '"').replace("''", '"').replace("`", "'")
    return t


def _heading(name: str, title: str) -> str:
    """A section's Markdown heading, or a \\paragraph's run-in title (a full stop added)."""
    if name in HEADINGS:
        return f"\n\n{HEADINGS[name]} {title}\n\n"
    return f"\n\n{title}{'' if title[-1:] in '.?!:' else '.'} "


# \char's code: `\c (c one character, or one letter then none), `c, decimal, 'octal or "hex, then
# one optional space (TeX's grammar for a number).
CHAR_CODE = re.compile(
    r"[ \t]*\n?[ \t]*(?:`(?:\\(?P<symbol>[^a-zA-Z@]|[a-zA-Z@](?![a-zA-Z@]))|(?P<plain>[^\\\s{}]))"
    r"|(?P<dec>[0-9]+)|'(?P<oct>[0-7]+)|\"(?P<hex>[0-9A-F]+)) ?"
)
BLANKS_THEN_LINE = re.compile(r"[ \t\r]*(?:\n[ \t\r]*)?")


def _skipped_blanks(text: str) -> int:
    """How many leading characters of `text` TeX skips after a control word or before an
    argument: blanks and one line end, not a blank line (a paragraph break)."""
    end = BLANKS_THEN_LINE.match(text).end()
    if "\n" in text[:end] and text.startswith("\n", end):
        return text.index("\n")  # a blank line: its first line end stays
    return end


# TeX's skips and kerns take a bare dimension or glue: \vskip 0.3in, \hskip 1em plus 2pt minus 1pt
GLUE_WORDS = frozenset({"vskip", "hskip", "kern", "mskip", "mkern"})
_DIMEN = r"[ \t]*[-+]?[ \t]*(?:\d+(?:\.\d*)?|\.\d+)[ \t]*(?:true)?(?:pt|pc|in|bp|cm|mm|dd|cc|sp|em|ex|mu|fil+)?"
GLUE = re.compile(rf"\s*(?:{_DIMEN}(?:[ \t]*(?:plus|minus){_DIMEN})*)?")
PUNCT_SPACE = re.compile(r"[ ]+(?=[.,;:!?])")
PROTECTED = re.compile("([\x00\x01])(\\d+)[\x00\x01]")
# Where a \ref or \cite was dropped (DROPPED_REFERENCE): a reference noun before it is read as a
# noun (`latex_references`), then `tidy` removes a run of them with the brackets, tie and list
# separators around it, which would read "Eq. ()", "(Theorem )" or "[, ]", and then the mark.
# Possessive, and blanks taken from their first only: linear however long a run of blanks is.
_REFERENCE_RUN = "\x02(?:[ \t,;–-]*+(?:(?:and|or|to|&)[ \t,;–-]*+)?\x02)*+"
# what may stand in a bracket with its citations alone: "(see, e.g., \cite{a})", "[cf. \cite{b}]"
_LEAD_IN = r"(?:(?i:see(?: also)?|cf\.|e\.g\.|i\.e\.|for (?:example|instance))[ \t,;:]*+)*+"
_LEAD_OUT = r"(?:[ \t,;]*+(?:and )?references therein)?"
EMPTY_BRACKETS = re.compile(rf"(?<![ \t])[ \t]*+[(\[][ \t]*+{_LEAD_IN}{_REFERENCE_RUN}{_LEAD_OUT}[ \t]*+[)\]]")
REFERENCE_RUN = re.compile(rf"(?<![ \t])[ \t]*+{_REFERENCE_RUN}(?:[ \t]++(?=[)\]]))?")
# A run between an abbreviation's period and the sentence's ("Eq.~\eqref{e}.", "etc.~\cite{a}."):
# gone with the second period, else it read "Eq.."; an ellipsis after it stays whole.
PERIOD_REFERENCE = re.compile(
    rf"(?<=\.)[ \t]*+(?:[(\[][ \t]*+{_REFERENCE_RUN}[ \t]*+[)\]]|{_REFERENCE_RUN})[ \t]*+\.(?!\.)"
)
# A run with a possessive after it ("\cite{a}'s results"): see `_possessive`. Every run is
# matched whole, the possessive optional: required, a run without one was tried again from each
# of its references to its end (4,000 citations in a row: 0.7 s against 0.03 s, O(n^2)).
POSSESSIVE_REFERENCE = re.compile(rf"(?<![ \t])[ \t]*+{_REFERENCE_RUN}(?:(['’]s)(?![^\W\d_]))?")


class LatexConverter(LatexTokens):
    """Convert one LaTeX fragment; `theorems` maps environment names to printed titles."""

    def __init__(
        self,
        source: str,
        theorems: dict[str, str] | None = None,
        counts: Counter | None = None,
        declared: Declared = NO_DECLARATIONS,
    ):
        """`declared`: the declarations (short verbs, verbatim-like environments) in force where
        `source` starts."""
        if any(c in source for c in ("\x00", "\x01", DROPPED_REFERENCE, HINT)):  # reserved for placeholders
            for c in ("\x00", "\x01", DROPPED_REFERENCE, HINT):
                source = source.replace(c, "")
        super().__init__(source, declared)
        self.theorems = {**THEOREMS, **(theorems or {})}
        self.counts = counts if counts is not None else Counter()
        self.code: list[str] = []
        self.frames: list[Frame] = []  # `convert`'s stack
        self.captures = 0  # `_capture`s open

    # --- conversion ----------------------------------------------------------------------------
    def convert(self, i: int, j: int, out: list[str]) -> None:
        """Convert tokens [i, j) into `out`. A group, an environment's body or a heading's title is
        a frame on an explicit stack, not a recursive call, so any depth of nesting converts (20,000
        unclosed \\begin{itemize} raised RecursionError). Not re-entrant: a handler that needs a
        stretch converted `_enter`s or `_capture`s it."""
        frames: list[Frame] = [(i, j, out, None)]
        self.frames = frames
        kind, val = self.kind, self.val
        while frames:
            i, j, out, done = frames.pop()
            while i < j:
                k = kind[i]
                if k == TEXT:
                    out.append(_fix_text(val[i]))
                    i += 1
                elif k == BRACE:
                    if val[i] == "{":
                        e = min(self.match[i], j)
                        frames.append((e + 1, j, out, done))
                        frames.append((i + 1, e, out, None))
                        break
                    i += 1
                elif k == BRACKET:
                    out.append(val[i])
                    i += 1
                elif k == LITERAL:
                    i = self._literal(i, out)
                elif k == TIE:
                    out.append(" ")
                    i += 1
                elif k == DOLLAR:
                    i = self._dollar(i, j, out)
                elif k == SYMBOL:
                    i = self._symbol(i, j, out)
                else:
                    entered = len(frames)
                    i = self._word(i, j, out)
                    if len(frames) > entered:  # it entered stretches: they run in order, then this one goes on
                        frames[entered:] = [*reversed(frames[entered:])]
                        frames.insert(entered, (i, j, out, done))
                        break
            else:
                if done is not None:
                    done()

    def _enter(self, i: int, j: int, out: list[str], done: Callable[[], None] | None = None) -> None:
        """Have `convert` convert [i, j) into `out` and then call `done`, once the current token's
        handler returns and before it goes on; the stretches a handler enters run in that order."""
        self.frames.append((i, j, out, done))

    def _capture(self, i: int, j: int, done: Callable[[str], None]) -> bool:
        """`_enter` [i, j) into a list of its own, `done` then getting its text (a title, a label, an
        alltt body); False, entering nothing, inside `MAX_CAPTURES` others: the caller reads it in
        line."""
        if self.captures >= MAX_CAPTURES:
            return False
        self.captures += 1
        out: list[str] = []

        def finish() -> None:
            self.captures -= 1
            done("".join(out))

        self._enter(i, j, out, finish)
        return True

    def _dollar(self, i: int, j: int, out: list[str]) -> int:
        close = self._find(i + 1, j, DOLLAR, self.val[i])
        if close is None:
            self.counts["unclosed_math"] += 1
            return i + 1
        out.append(self._math(self.src[self.start[i] : self.end[close]], self.val[i] in ("$$", "\\[")))
        return close + 1

    def _math(self, raw: str, display: bool) -> str:
        """Math source is kept (minus \\label) behind a placeholder that `tidy` restores."""
        self.code.append(LABEL.sub("", raw) if "\\label" in raw else raw)
        mark = f"\x01{len(self.code) - 1}\x01"
        return f" {mark} " if display else mark

    def _symbol(self, i: int, j: int, out: list[str]) -> int:
        c = self.val[i][1:]
        if c == "\\":  # a line break; the star of \\* (no page break there) goes with it
            out.append("\n")
            k = i + 1
            if k < self.n and self.kind[k] == TEXT:  # LaTeX looks for the star past blanks
                val = self.val[k]
                at = _skipped_blanks(val)
                if val.startswith("*", at):
                    if at + 1 < len(val):
                        out.append(_fix_text(val[at + 1 :]))
                        return k + 1
                    k += 1
            return self._skip_args(k, "[")
        if c in "([":
            close = self._find_symbol(i + 1, j, "\\)" if c == "(" else "\\]")
            if close is None:
                self.counts["unclosed_math"] += 1
                return i + 1
            out.append(self._math(self.src[self.start[i] : self.end[close]], self.val[i] in ("$$", "\\[")))
            return close + 1
        if c in ACCENTS:
            return self._accent(c, i + 1, out)
        if c in "%&$#_{}":
            out.append(c)
        elif c in SPACING_SYMBOLS:
            out.append(" ")
        elif c not in SILENT_SYMBOLS:
            self.counts["unknown_symbol"] += 1
        return i + 1

    def _accent(self, accent: str, j: int, out: list[str]) -> int:
        if j >= self.n:
            return j
        if self.kind[j] == BRACE and self.val[j] == "{":
            e = self.match[j]
            letter = self.src[self.end[j] : self.start[e]] if e < self.n else ""
            out.append(accent_text(accent, letter.strip()))
            return e + 1
        if self.kind[j] == WORD:  # \"\i: the blanks after \i go, as after any control word
            out.append(accent_text(accent, self.val[j]))
            return self._after_control_word(j + 1, out)
        if self.kind[j] == TEXT:  # the argument is the first character after blanks: \c c, \" o
            val = self.val[j]
            at = _skipped_blanks(val)
            if at < len(val) and val[at].strip():
                out.append(accent_text(accent, val[at]) + _fix_text(val[at + 1 :]))
                return j + 1
        return j

    def _after_control_word(self, j: int, out: list[str]) -> int:
        """The text run at token j (if it is one) without the blanks TeX skips after a control
        word, so that Bj\\o rn reads Bjørn; the index after what was taken."""
        if j >= self.n or self.kind[j] != TEXT:
            return j
        rest = self.val[j][_skipped_blanks(self.val[j]) :]
        if rest:
            out.append(_fix_text(rest))
        return j + 1

    def _word(self, i: int, j: int, out: list[str]) -> int:
        name = self.val[i][1:]
        base = name.rstrip("*")
        if base == "begin":
            return self._environment(i, j, out)
        if base == "end":
            named = self._env_name(i)
            return named[1] if named else i + 1
        if base in HEADINGS or base in RUN_IN_HEADINGS:
            k = self._skip_args(i + 1, "[")
            g = self._next(k)
            if g < self.n and self.kind[g] == BRACE and self.val[g] == "{" and self._capture(
                g + 1, self.match[g], lambda title: out.append(_heading(base, " ".join(title.split())))
            ):
                return self.match[g] + 1
            return k
        if base == "verb":  # unclosed on its line: TeX would stop; its text is kept
            return i + 1
        if base == "char":
            return self._char(i, out)
        if base == "texorpdfstring":  # hyperref: {TeX text}{PDF bookmark text}; the first is printed
            k = self._next(i + 1)
            if k < self.n and self.kind[k] == BRACE and self.val[k] == "{":
                e = self.match[k]
                self._enter(k + 1, e, out)
                return self._skip_args(min(e + 1, self.n), "{")
            return i + 1
        if base in SI_COMMANDS:
            return self._si(base, i, out)
        if base in GLUE_WORDS and i + 1 < self.n and self.kind[i + 1] == TEXT:  # \vskip 0.3in
            if rest := self.val[i + 1][GLUE.match(self.val[i + 1]).end() :]:
                out.append(_fix_text(rest))
            return i + 2
        if base == "twocolumn":  # its [..] is text set across both columns: a CVPR teaser's
            k = self._next(i + 1)  # caption, ICML's title block (its macros are dropped)
            if k < self.n and self.kind[k] == BRACKET and self.val[k] == "[":
                close = self._bracket_end(k)
                if close is not None:
                    self._enter(k + 1, close, out)
                    return close + 1
            return i + 1
        if base in DROP:
            if base in REFERENCES:
                if base in CLEVER_REFERENCES and (g := self._next(self._skip_args(i + 1, "*["))) < self.n \
                        and self.val[g] == "{" and self.kind[g] == BRACE and self.match[g] < self.n:
                    out.append(reference_hint(self._group_source(g), base in PLURAL_REFERENCES))  # "Theorem 3"
                out.append(DROPPED_REFERENCE)
            return self._skip_args(i + 1, DROP[base])
        if base == "item":
            out.append("\n- ")
            k = self._next(i + 1)
            if k < self.n and self.kind[k] == BRACKET and self.val[k] == "[":
                close = self._bracket_end(k)
                if close is not None and self._capture(k + 1, close, lambda label: out.append(label.strip() + ": ")):
                    return close + 1
            return i + 1
        if base == "ensuremath":
            k = self._next(i + 1)
            if k < self.n and self.val[k] == "{" and self.kind[k] == BRACE:
                e = self.match[k]
                out.append(self._math("$" + self.src[self.end[k] : self.start[e] if e < self.n else len(self.src)] + "$", False))
                return e + 1
            return i + 1
        if base in ACCENT_WORDS:
            k = self._next(i + 1)
            if k < self.n and self.kind[k] in (BRACE, TEXT) and (taken := self._accent(base, k, out)) > k:
                return taken
        symbol = symbol_text(base)
        if symbol is not None:
            out.append(symbol)
            if len(symbol) == 1 and (symbol.isalpha() or symbol == "\\"):  # a letter inside a word: \o,
                return self._after_control_word(i + 1, out)  # \ss, \L; \textbackslash names a command
            return i + 1
        # Unknown or formatting macro: drop its optional arguments, keep mandatory groups' text.
        shape = macro_args(base)
        return self._skip_args(i + 1, shape[: len(shape) - len(shape.lstrip("*["))])

    def _si(self, base: str, i: int, out: list[str]) -> int:
        """siunitx's \\SI{3}{\\metre}, \\qty, \\si, \\num, \\SIrange, \\numlist, \\ang... at token i:
        numbers converted, the unit printed (`si_unit`), a list's or angle's {a;b} spelled out
        (`si_items`), [options] dropped; the index after it. With a group missing it is read as
        an unknown macro (its groups' text kept)."""
        numbers, has_unit = SI_COMMANDS[base]
        k, groups = i + 1, []
        while len(groups) < numbers + has_unit:
            g = self._next(self._skip_args(k, "["))
            if g >= self.n or self.kind[g] != BRACE or self.val[g] != "{" or self.match[g] >= self.n:
                return i + 1
            groups.append(g)
            k = self.match[g] + 1
        unit = si_unit(self._group_source(groups[-1])) if has_unit else ""
        if not numbers:
            out.append(unit)
        elif (base in SI_LISTS or base == "ang") and (items := si_items(base, self._group_source(groups[0]), unit)) is not None:
            out.append(items)
            return k
        for n, g in enumerate(groups[:numbers]):
            after = ("–" if n < numbers - 1 else f" {unit}" if unit else "")
            self._enter(g + 1, self.match[g], out, lambda after=after: out.append(after))
        return k

    def _group_source(self, g: int) -> str:
        """The source inside the closed group whose { is token g."""
        return self.src[self.end[g] : self.start[self.match[g]]]

    def _char(self, i: int, out: list[str]) -> int:
        """\\char with its character code (`\\\\, `x, 92, '134, "5C) at token i: the character, an
        unprintable one dropped; the index after it. Without a code it is dropped alone."""
        m = CHAR_CODE.match(self.src, self.end[i])
        if m is None:
            return i + 1
        k = i + 1
        while k < self.n and self.end[k] <= m.end():
            k += 1
        rest = ""
        if k < self.n and self.start[k] < m.end():  # the code ends inside a text run: "92 apples"
            if self.kind[k] != TEXT:
                return i + 1
            rest, k = _fix_text(self.src[m.end() : self.end[k]]), k + 1
        if char := m["symbol"] or m["plain"]:
            code = ord(char)
        else:
            code = int(m["dec"]) if m["dec"] else int(m["oct"], 8) if m["oct"] else int(m["hex"], 16)
        char = chr(code) if code < 0x110000 else ""
        out.append((char if char.isprintable() else "") + rest)
        return k

    def _literal(self, i: int, out: list[str]) -> int:
        """The literal span at token i, as `latex_rules` says: inline code (\\verb, a short verb,
        \\Verb, \\lstinline, \\mintinline, \\path, a \\newmintinline command) in backticks, \\mint's
        code (and a \\newmint command's) as a fenced block, \\nolinkurl's text as is; \\url, \\href's
        URL, \\newmintedfile commands and declarations dropped, a declaration with the code and
        options after it (the link text after \\href{URL} is an ordinary group). Returns the index
        after it."""
        span = self.literal[i]
        inner = self.src[span.inner_start : span.inner_end]
        if span.kind in LITERAL_CODE:
            out.append(f"`{inner}`")
        elif span.kind in LITERAL_BLOCK:
            out.append(self._code_block(inner))
        elif span.kind in LITERAL_TEXT:
            out.append(inner)
        elif span.kind in DECLARATION_TAILS:
            return self._skip_args(i + 1, DECLARATION_TAILS[span.kind])
        return i + 1

    def _code_block(self, body: str) -> str:
        if "\x00" in body or "\x01" in body:  # converted text (alltt): its math and code restored
            body = PROTECTED.sub(lambda m: self.code[int(m.group(2))], body)
        body = _without_reference_marks(body)  # converted text (alltt): its dropped \ref's
        self.code.append("```\n" + body.strip("\n") + "\n```")
        return f"\n\n\x00{len(self.code) - 1}\x00\n\n"

    def _environment(self, i: int, j: int, out: list[str]) -> int:
        named = self._env_name(i)
        if named is None:
            return i + 1
        name, inner = named
        end = min(self.env_end.get(i, self.n), j)
        after = end
        if end < j:
            closing = self._env_name(end)
            after = closing[1] if closing else end + 1
        role, args = self.spans.declared_at(self.start[i]).env(name) or (None, env_args(name))
        if role == ROLE_LATEX:  # made an ordinary wrapper by \includecomment & co.: its body is read
            self._enter(inner, end, out)
        elif role is None and name in MATH_ENVS:
            out.append(self._math(self.src[self.start[i] : self.end[after - 1]], True))
        elif role == ROLE_DROP or (role is None and name in DROP_ENVS):
            self.counts["env_dropped"] += 1
        elif role == ROLE_CODE or name in CODE_ENVS:
            if (span := self.env_body.get(self.start[i])) is not None:
                body = self.src[span.inner_start : span.inner_end]
            else:  # not literal (`code`), or unclosed: to the end
                inner = self._skip_args(inner, args)
                body = self.src[self.start[inner] if inner < self.n else len(self.src) : self.start[end] if end < self.n else len(self.src)]
            out.append(self._code_block(body))
        elif name in LINE_ENVS:  # LaTeX whose lines and spaces are kept (alltt)
            inner = self._skip_args(inner, args)
            if not self._capture(inner, end, lambda lines: out.append(self._code_block(lines))):
                self._enter(inner, end, out)
        elif name in self.theorems:
            title = self.theorems[name]
            k = self._next(inner)
            close = self._bracket_end(k) if k < self.n and self.kind[k] == BRACKET and self.val[k] == "[" else None
            if close is not None and self._capture(
                k + 1, close, lambda label: out.append(f"\n\n{title} ({' '.join(label.split())}). ")
            ):
                inner = close + 1
            else:
                out.append(f"\n\n{title}. ")
            self._enter(inner, end, out, lambda: out.append("\n\n"))
        else:
            if name in HEADING_ENVS:
                out.append(f"\n\n## {HEADING_ENVS[name]}\n\n")
            gap = "\n" if name in LIST_ENVS else " "
            out.append(gap)
            self._enter(self._skip_args(inner, args), end, out, lambda: out.append(gap))
        return after

    def text(self) -> str:
        """The whole fragment as tidy text: paragraphs reflowed, headings and list items kept."""
        out: list[str] = []
        self.convert(0, self.n, out)
        return tidy("".join(out), self.code)


def _without_reference_marks(text: str) -> str:
    """`text` without the DROPPED_REFERENCE marks and the brackets and separators they leave."""
    if DROPPED_REFERENCE not in text:
        return text
    text = read_reference_nouns(text)
    text = POSSESSIVE_REFERENCE.sub(_possessive, PERIOD_REFERENCE.sub("", text))
    return REFERENCE_RUN.sub("", EMPTY_BRACKETS.sub("", text))


def _possessive(m: re.Match) -> str:
    """The possessive after a dropped reference run: kept on a name before it ("Smith~\\cite{a}'s"
    reads "Smith's", "et al.'s" too), else dropped with it, since the reference was the noun
    ("\\cite{a}'s results" read "'s results", "of \\cite{a}'s group" "of's group")."""
    if m.group(1) is None:
        return m.group(0)  # no possessive: the run stays for REFERENCE_RUN
    before = m.string[max(0, m.start() - 40) : m.start()].split()
    word = before[-1] if before else ""
    named = word[:1].isupper() and word[-1:].isalpha() or word.endswith("al.")
    return m.group(1) if named else ""


def tidy(text: str, code: list[str]) -> str:
    """Collapse blanks; join lines inside a paragraph, except headings, list items and code.

    Math and code sit behind placeholders (\\x01n\\x01, \\x00n\\x00) until the end, so they
    come out byte for byte.
    """
    text = _without_reference_marks(text)
    blocks = []
    for block in BLANK_LINES.split(SPACES.sub(" ", text)):
        lines: list[str] = []
        for line in block.split("\n"):
            line = line.strip()
            if not line:
                continue
            if lines and not line.startswith(("- ", "#", "\x00")) and not lines[-1].startswith(("#", "\x00")):
                lines[-1] += " " + line
            else:
                lines.append(line)
        if lines:
            blocks.append("\n".join(lines))
    result = PUNCT_SPACE.sub("", "\n\n".join(blocks))
    return PROTECTED.sub(lambda m: code[int(m.group(2))], result) if code else result
