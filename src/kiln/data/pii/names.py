"""Person-name detection, driven by context rather than a downloaded NER model.

Strong contexts (no lexicon needed): author/maintainer fields in code and metadata, `Name <email>`,
`Copyright (c) YEAR Name`, "Written by", git trailers (Signed-off-by, Co-authored-by …),
docstring tags (`@author`, `:author:`), `first_name`/`full_name` values, signature lines after a
closing ("Best regards,") and greetings ("Hi Ana,"). Weak context: in prose, a given name from
the compact lexicon followed by a capitalised surname. Organisation holders ("Google LLC",
"The Foo Authors") are not names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kiln.data.pii.lexicon import (
    FIRST_NAMES,
    NOT_NAME_WORDS,
    ORG_WORDS,
    PARTICLES,
    TITLES,
)
from kiln.data.pii.spans import Span

_UP = "A-ZÀ-ÖØ-ÞĀ-Ž"
_LO = "a-zß-öø-ÿā-ž"
TOKEN = rf"(?:[{_UP}](?:[{_LO}]+(?:[{_UP}][{_LO}]+)?|\.|['’][{_UP}][{_LO}]+)(?:[-'’][{_UP}]?[{_LO}]+)*)"
PARTICLE = r"(?:van|von|de|der|den|da|di|del|della|la|le|du|dos|das|bin|al|ten|ter|v\.)"
# One to four capitalised tokens, particles allowed inside ("Ludwig van Beethoven").
NAME_SEQ = rf"{TOKEN}(?:[ \t]+(?:{PARTICLE}[ \t]+)*{TOKEN}){{0,3}}"
_TITLE = r"(?:(?:Mr|Mrs|Ms|Dr|Prof)\.?[ \t]+)?"

FIELD_WORDS = [
    "authors?", "maintainers?", r"written[ \t]+by", r"created[ \t]+by", r"developed[ \t]+by",
    r"contributed[ \t]+by", r"reported[ \t]+by", "signed-off-by", "co-authored-by",
    "reviewed-by", "acked-by", "tested-by", "reported-by", "suggested-by", "helped-by", "committer",
    "moduleauthor", "sectionauthor", "contact", "owner", "full_?name", "display_?name",
    "contact_?name", "first_?name", "last_?name", "given_?name", "family_?name", "surname",
]


def _by_first_letter(words: list[str]) -> str:
    """An alternation grouped by first letter (order kept within each letter, so it matches
    exactly what the flat one does): the engine tries one group per position instead of
    every word, which halved this pattern's time on source code."""
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[0], []).append(w[1:])
    return "|".join(f"{c}(?:{'|'.join(rest)})" for c, rest in groups.items())


STRONG_CONTEXTS = [
    # trailers, headers and fields: "Author: X", "Signed-off-by: X", "maintainer = 'X'"
    # (the field word is never the start of a call or class: `class DisplayName(Phrase)`)
    rf"(?i:(?<![A-Za-z])(?:{_by_first_letter(FIELD_WORDS)})|^(?:From|To|Cc|Reply-To))(?!\()"
    rf"(?:__)?[\"']?[ \t]*(?:::?|=>|=|:)?[ \t]*[\[\"'(]?[ \t]*{_TITLE}(?P<name>{NAME_SEQ})",
    rf"(?i:@author|:author:)[ \t]+{_TITLE}(?P<name>{NAME_SEQ})",
    # Maven/NuGet people blocks: <developer> … <name>X</name>
    rf"<(?:developer|contributor)>[^<]*(?:<(?!/(?:developer|contributor))[^<]*)*?<name>[ \t]*(?P<name>{NAME_SEQ})[ \t]*</name>",
    # "Jane Doe <jane@x.org>" and "Jane Doe (jane@x.org)"
    rf"(?<![\w.])(?P<name>{NAME_SEQ})[ \t]*[<(][^\s<>()@]+@",
    # signature: closing line, then the name alone on the next line (one [ \t]* before
    # the closing word: two adjacent ones cost O(indent^2) tries on every indented line)
    rf"(?im:^[ \t]*(?:(?:best|kind|warm)[ \t]*)?(?:regards|thanks|thank you|many thanks|cheers|"
    rf"sincerely|best wishes|yours truly|best|--)[,!.]?[ \t]*\n[ \t]*)(?P<name>{NAME_SEQ})[ \t]*$",
    # greeting: "Hi Ana," / "Dear Dr. Okafor,"
    rf"(?i:\b(?:hi|hello|hey|dear))[ \t]+{_TITLE}(?P<name>{NAME_SEQ})[ \t]*[,!:]",
]
STRONG = [re.compile(p, re.MULTILINE) for p in STRONG_CONTEXTS]
COPYRIGHT = re.compile(  # also SPDX's "SPDX-FileCopyrightText: 2021 Name"
    r"(?i:copyright(?:text)?(?::(?=[ \t]*\d))?|\(c\)|©)[ \t]*(?:\((?i:c)\)|©)?[ \t]*"
    r"(?P<years>\d{4}(?:[ \t]*[-–,][ \t]*(?:\d{4}|present))*)?[ \t]*,?[ \t]*(?:by[ \t]+)?"
    rf"(?P<holders>{NAME_SEQ}(?:[ \t]*(?:,|and|&)[ \t]*{NAME_SEQ})*)")
PROSE = re.compile(rf"(?<![\w.@/])(?P<name>{TOKEN}(?:[ \t]+(?:{PARTICLE}[ \t]+)?{TOKEN}){{1,2}})(?![\w@])")


_ESCAPED_LETTERS = re.compile(r"(?:\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2})[^\W\d_]*")


def _clean(text: str, start: int, end: int) -> tuple[int, int] | None:
    """Trim non-name words at either end; None when nothing name-like remains."""
    words = [(m.start() + start, m.end() + start) for m in re.finditer(r"\S+", text[start:end])]
    while words and (text[words[0][0]:words[0][1]].lower() in NOT_NAME_WORDS | TITLES):
        words.pop(0)
    while words and (text[words[-1][0]:words[-1][1]].lower() in NOT_NAME_WORDS | PARTICLES):
        words.pop()
    if not words:
        return None
    s, e = words[0][0], words[-1][1]
    while esc := _ESCAPED_LETTERS.match(text, e):  # "Gust\u00e4bel" in a source literal
        e = esc.end()
    if text[e - 2:e] in ("'s", "’s"):  # "Sam Rushing's": the name, not its possessive
        e -= 2
    if text[e:e + 1] in ("(", "[", "_") or text[s - 1:s] in (".", "_"):
        return None  # a call, subscript or attribute (`display_name = DisplayName()`): code
    if any(text[a:b].lower().rstrip(".") in ORG_WORDS for a, b in words):
        return None
    if text[s:e].isupper() and e - s > 3:  # CONSTANT_NAMES / headings
        return None
    if len(words) == 1 and (e - s < 2 or text[s:e].endswith(".")):
        return None
    return s, e


def _org_follows(text: str, end: int) -> bool:
    nxt = re.match(r"[ \t,]*([A-Za-z.]+)", text[end:end + 30])
    return nxt is not None and nxt.group(1).lower().rstrip(".") in ORG_WORDS | {"inc", "llc"}


def find_names(text: str) -> Iterator[Span]:
    for i, pattern in enumerate(STRONG):
        for m in pattern.finditer(text):
            got = _clean(text, m.start("name"), m.end("name"))
            if got and " " not in text[got[0]:got[1]] and not (
                    i >= 4 or "name" in m.group(0)[:m.start("name") - m.start()].lower()
                    or text[got[0]:got[1]].lower() in FIRST_NAMES):
                continue  # a lone capitalised word after "created by" is usually a tool
            if got and not _org_follows(text, got[1]) and not text[got[0]:got[1]].startswith("The "):
                yield Span("NAME", got[0], got[1], text[got[0]:got[1]])
    for m in COPYRIGHT.finditer(text):
        holders = m.group("holders")
        if holders.startswith("The ") or _org_follows(text, m.end("holders")):
            continue
        base = m.start("holders")
        for part in re.finditer(rf"{NAME_SEQ}", holders):
            got = _clean(text, base + part.start(), base + part.end())
            # each holder by itself: "Elemental Security, Inc." is a company in any list
            if got and len(text[got[0]:got[1]].split()) >= 2 and not _org_follows(text, got[1]):
                yield Span("NAME", got[0], got[1], text[got[0]:got[1]])
    pos = 0
    while (m := PROSE.search(text, pos)) is not None:
        words = m.group("name").split()
        if words[0].lower() not in FIRST_NAMES or words[1].lower() in NOT_NAME_WORDS:
            # "When Maria Garcia", "Professor David Miller": try again from the next word
            pos = text.index(words[1], m.start("name") + len(words[0]))
            continue
        pos = m.end()
        got = _clean(text, m.start("name"), m.end("name"))
        if got and len(text[got[0]:got[1]].split()) >= 2 and not _org_follows(text, got[1]):
            yield Span("NAME", got[0], got[1], text[got[0]:got[1]])
