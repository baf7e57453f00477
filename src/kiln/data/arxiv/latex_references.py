"""What a dropped cross-reference leaves: its noun, read as a noun.

References are dropped (`latex_rules`: the text has no numbers to give them), which left the
word that announced one dangling: "As shown in Eq., the loss falls", "See Figs., which",
"Section shows it". A reference noun followed by its references (`Eq.~\\eqref{e}`,
`Figs.~\\ref{a} and~\\ref{b}`, `Ref.~\\cite{a}`) reads as the noun with an article: "the
equation", "the figures" (no article after a determiner: "our theorem"; "The" at a sentence's
start), where the word before is an English one it knows (`ARTICLE_AFTER`) and the text reads
as English (`OTHER_WORDS`); elsewhere the noun stays as written. cleveref's \\cref and
\\autoref print the kind themselves ("Theorem 3"): the converter marks one with the kind its
label's prefix names (`thm:` theorem, `fig:` figure...), read the same way; with no known prefix
it is dropped as any reference.

The converter writes a reference as `DROPPED_REFERENCE`, a cleveref one with its kind before
it between two `HINT` marks; `read_reference_nouns` runs before the marks are cleaned up.
"""

from __future__ import annotations

import re

DROPPED_REFERENCE = "\x02"
HINT = "\x03"
# noun -> (its abbreviations and words, singular and plural); the first plural is the output's
_NOUNS = {
    "equation": ("Eq. Eqn. Equation", "Eqs. Eqns. Equations"),
    "figure": ("Fig. Figure", "Figs. Figures"),
    "table": ("Tab. Table", "Tabs. Tables"),
    "section": ("Sec. Sect. Section §", "Secs. Sects. Sections §§"),
    "subsection": ("Subsection", "Subsections"),
    "chapter": ("Ch. Chap. Chapter", "Chs. Chaps. Chapters"),
    "appendix": ("App. Appx. Appendix", "Appendices Apps. Appendixes"),
    "theorem": ("Thm. Theorem", "Theorems Thms."),
    "lemma": ("Lem. Lemma", "Lemmas Lemmata"),
    "corollary": ("Cor. Corollary", "Corollaries"),
    "proposition": ("Prop. Proposition", "Propositions Props."),
    "definition": ("Def. Defn. Definition", "Definitions Defs."),
    "algorithm": ("Alg. Algo. Algorithm", "Algorithms Algs."),
    "remark": ("Rem. Remark", "Remarks"),
    "example": ("Ex. Example", "Examples"),
    "assumption": ("Assumption", "Assumptions"),
    "conjecture": ("Conjecture", "Conjectures"),
    "property": ("Property", "Properties"),
    "condition": ("Condition", "Conditions"),
    "step": ("Step", "Steps"),
    "line": ("Line", "Lines"),
    "listing": ("Listing", "Listings"),
    "reference": ("Ref. Reference", "References Refs."),
}
# label prefix (before ':' or '-') -> kind, for \cref, \Cref and \autoref
LABEL_KINDS = {
    **dict.fromkeys(("eq", "eqn", "equation"), "equation"), **dict.fromkeys(("fig", "figure"), "figure"),
    **dict.fromkeys(("tab", "table", "tbl"), "table"),
    **dict.fromkeys(("sec", "sect", "section", "subsec", "ssec"), "section"),
    **dict.fromkeys(("ch", "chap", "chapter"), "chapter"), **dict.fromkeys(("app", "appx", "appendix"), "appendix"),
    **dict.fromkeys(("thm", "theorem"), "theorem"), **dict.fromkeys(("lem", "lemma"), "lemma"),
    **dict.fromkeys(("cor", "corollary"), "corollary"), **dict.fromkeys(("prop", "proposition"), "proposition"),
    **dict.fromkeys(("def", "defn", "definition"), "definition"), **dict.fromkeys(("alg", "algo", "algorithm"), "algorithm"),
    **dict.fromkeys(("rem", "remark"), "remark"), **dict.fromkeys(("ex", "example"), "example"),
    **dict.fromkeys(("ass", "assump", "assumption"), "assumption"), "conj": "conjecture", "lst": "listing",
}
PLURALS = {kind: next(w for w in plural.split() if w.isalpha()).lower() for kind, (_, plural) in _NOUNS.items()}
_FORMS: dict[str, tuple[str, bool]] = {}  # a noun as written -> (kind, plural)
for _kind, (_singular, _plural) in _NOUNS.items():
    for _forms, _many in ((_singular, False), (_plural, True)):
        for _form in _forms.split():
            _FORMS[_form] = _FORMS[_form[0].lower() + _form[1:]] = (_kind, _many)
_MARK = f"(?:{HINT}[a-z]+\\+?{HINT})?{DROPPED_REFERENCE}"
# a reference, bracketed or not, with a sub-label stuck to it ("Fig.~\\ref{f}a", "\\ref{f}(b)")
_ITEM = rf"(?:\([ \t]*+{_MARK}[ \t]*+\)|{_MARK})(?:\([a-z]{{1,5}}\)|[a-z](?!\w))?+"
# a run of references and the brackets, tie and separators between them; all possessive, so a
# failed run costs what it read
REFERENCE_RUN = re.compile(rf"(?=[(\x02\x03]){_ITEM}(?:[ \t,;–-]*+(?:(?:and|or|to|&)[ \t,;–-]*+)?{_ITEM})*+")
_NOUN = "|".join(re.escape(form) for form in sorted(_FORMS, key=len, reverse=True))
NOUN_BEFORE = re.compile(rf"(?<![\w.])({_NOUN})[ \t]*+\Z")  # read on the few characters before a run
HINTED = re.compile(f"{HINT}([a-z]+)(\\+?){HINT}")
LOOKBACK = 40
# ("that" and "which" are more often a conjunction or pronoun: "note that Theorem~\\ref{t} yields")
DETERMINERS = frozenset("the this these those our its their his her each every same any".split())
# a word between a determiner and the noun that is no adjective: "the proof of Theorem" is not "the theorem"
LINKS = frozenset("of in on at by to for from with and or as than via see under into over is are was were".split())
# English words after which a noun phrase reads "the <noun>": anywhere else (another language's
# "dans la section~\\ref{s}", an unlisted verb) the noun stays as written, and a cleveref
# reference is dropped, as before
ARTICLE_AFTER = LINKS | frozenset(
    "see cf. also both between after before like using use following per then shows show shown given "
    "described summarized summarised presented listed defined proved proven stated discussed displayed "
    "illustrated depicted reported derived explained introduced compare combining applying apply recall "
    "note whereas while where but yields gives implies follows that which".split()
)
# the commonest function words of English and of the other languages arXiv papers are written
# in (German, French, Spanish, Portuguese, Italian): a text with fewer English ones than others is
# no English, and its nouns stay as written ("Wie in Definition~\\ref{d} gezeigt", "(Tab.~\\ref{t})")
ENGLISH_WORDS = re.compile(r"\b(?:the|of|and|to|is|are|we|this|that|with|for|in)\b", re.IGNORECASE)
OTHER_WORDS = re.compile(
    r"\b(?:der|die|und|ist|nicht|mit|von|zu|das|den|le|la|les|des|est|une|dans|pour|du|et|en|el|los|"
    r"las|del|que|por|una|para|em|os|il|di|che|della|per|gli)\b", re.IGNORECASE
)
ABBREVIATIONS = frozenset(("e.g.", "i.e.", "cf.", "vs.", "resp.", "etc.", "al."))
SENTENCE_START = re.compile(r"(?:\A\s*|\n[ \t]*\n|\n[ \t]*-)[ \t]*\Z")  # a paragraph's or list item's start
LEADING_PUNCTUATION = "([\"'“‘"


def reference_hint(label: str, plural: bool = False) -> str:
    """The mark of the kind a cleveref reference to `label` prints, from its prefix ("" when it
    names none); a list of labels `a,b` is read by its first, the kind made plural (`plural`: a
    range's)."""
    first = label.split(",", 1)[0].strip()
    parts = re.split(r"[:\-_.]", first, maxsplit=1)
    kind = LABEL_KINDS.get(parts[0].lower(), "") if len(parts) == 2 else ""
    return f"{HINT}{kind}{'+' if plural or ',' in label else ''}{HINT}" if kind else ""


def _phrase(text: str, at: int, kind: str, plural: bool) -> str | None:
    """'the <kind>' for a noun phrase starting at `at` in `text`, 'The' at a sentence's start, no
    article after a determiner (one word back, or two over an adjective); None where the word
    before is none `ARTICLE_AFTER` knows nor ends a reference (a list of nouns)."""
    before = text[max(0, at - LOOKBACK) : at]
    before = before[before.rfind("\n\n") + 1 :]  # this paragraph's words only (a heading's are not)
    words = before.split()
    noun = PLURALS[kind] if plural else kind
    back = [w.lower().lstrip(LEADING_PUNCTUATION) for w in words[-2:]]
    opened = before.rstrip(" \t").endswith(("(", "["))  # "(Theorem~\\ref{t})"
    ended = [w for w in words if w not in "(["][-1:]  # the word before, past an opening bracket
    if SENTENCE_START.search(before) or (
        ended and ended[0][-1:] in ".!?" and ended[0].lower().lstrip(LEADING_PUNCTUATION) not in ABBREVIATIONS
        and (opened or not ended[0].startswith(LEADING_PUNCTUATION))
    ):
        return "The " + noun
    if back and (back[-1] in DETERMINERS or back[-1].endswith(("'s", "’s"))
                 or (len(back) == 2 and back[0] in DETERMINERS and back[1] not in LINKS and back[1].isalpha())):
        return noun
    listed = back and DROPPED_REFERENCE in back[-1]  # a list's next noun: "Thm.~\\ref{t}, Lem.~\\ref{l}"
    return "the " + noun if back and back[-1] in ARTICLE_AFTER or listed or opened else None


def _hinted_phrase(text: str, at: int, run: str) -> str | None:
    """A run of cleveref references read as their kinds, in order, each once ("\\cref{thm:a} and
    \\cref{lem:b}": "the theorem and the lemma"; two theorems: "the theorems"); None where the
    word before is none `_phrase` knows."""
    kinds: dict[str, bool] = {}
    for m in HINTED.finditer(run):
        kinds[m.group(1)] = m.group(1) in kinds or bool(m.group(2))
    if len(kinds) == 1:  # one kind: plural for any two references, hinted or not
        kinds = {kind: many or run.count(DROPPED_REFERENCE) > 1 for kind, many in kinds.items()}
    (first, many), *rest = kinds.items()
    phrase = _phrase(text, at, first, many)
    if phrase is None:
        return None
    return " and ".join((phrase, *(f"the {PLURALS[k] if p else k}" for k, p in rest)))


def _count(words: re.Pattern, text: str) -> int:
    return sum(1 for _ in words.finditer(text))


def read_reference_nouns(text: str) -> str:
    """`text` with each reference noun and its dropped references read as a noun phrase, and each
    hinted (cleveref) run with no noun before it as its kind's; other runs are left as one
    mark, for the clean-up of dropped references; in a text that reads as another language
    (`OTHER_WORDS`), every run is. One pass over the runs, a bounded look back from each."""
    if DROPPED_REFERENCE not in text:
        return text
    english = _count(ENGLISH_WORDS, text) >= _count(OTHER_WORDS, text)
    out, pos = [], 0
    for m in REFERENCE_RUN.finditer(text):
        run = m.group(0)
        before = text[max(pos, m.start() - LOOKBACK) : m.start()]
        noun = NOUN_BEFORE.search(before)
        hint = HINTED.match(run.lstrip("( \t"))
        phrase, at = None, m.start()
        if not english:
            pass
        elif noun is not None:
            kind, many = _FORMS[noun.group(1)]
            at = m.start() - len(before) + noun.start()
            phrase = _phrase(text, at, kind, many or run.count(DROPPED_REFERENCE) > 1)
        elif hint is not None:
            phrase = _hinted_phrase(text, at, run)
        if phrase is None:  # one mark stays, for the clean-up of the blank and period around it
            out.append(text[pos : m.start()])
            out.append(DROPPED_REFERENCE)
        else:
            out.append(text[pos:at])
            out.append(phrase)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)
