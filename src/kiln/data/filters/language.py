"""Language identification: keep documents written in one of `languages` (the arXiv digest's
"`langdetect` must say `en`" rule, counted there as `non_english`).

Why langdetect: it is the digest's tool, and its 55 language profiles ship inside the package
(datatrove's LanguageFilter needs fastText weights downloaded). Its detector samples n-grams at
random, so every document is scored with the same fixed seed: the decision is a function of
the text alone (the same for any task, worker or re-run).

Where this differs from the digest, on purpose (`strip_math = false` gives its rule): math spans
and LaTeX commands are removed before detection, since the digest notes that formula-heavy
papers are mis-detected when their raw text is scored (`$x_1$` is not a word of any language).
langdetect reads at most its first 10,000 characters of what it is given (its own default);
the math is stripped from the first 100,000 (a 1 MB part is not scanned whole for 10 KB).
Cost: ~20 ms a document on one core (~40 documents/s per task; langdetect's sampling is most of it).

Too little to judge. On a few words langdetect guesses ("Hello": Finnish, "OK": Portuguese,
"x = 1": Somali, a CSV header: Estonian). Measured on 3,000 snippets of English prose
(pydoc topics), it says English for 21-79 % of those under 20 letters, 92 % at 20-29, 98 % at
30 and over. A text with fewer than MIN_LETTERS letters left once math, URLs and e-mails are
gone (numbers, punctuation and markup are no evidence of a language) is undetermined, as a
text with no letter was already: `und`, dropped as `undetermined_language` in drop mode (the
prepare summary's drop reasons count it), tagged `und` in tag mode. It is not known to be in
a wanted language; the alternative, keeping it, would keep a short text in any language.
A Han, kana or Hangul character counts as DENSE_LETTERS letters: English's 20 were measured
on a 26-letter alphabet, and a character of these scripts says more (on the stdlib's CJK test
texts langdetect is right for 85 % of 7-character Chinese snippets, 95 % of Japanese, 100 %
of Korean; counted one a letter, a 19-character Japanese sentence was 'und').

The parts of a text the reader cut (over 1,000,000 characters: metadata `part_of`) are one
document: each takes the language of the first of them that reaches this filter. Judged
alone, a part of a book that is a table of figures was undetermined and dropped, leaving the
kept book with a hole.
"""

from __future__ import annotations

import functools
import itertools
import os
import re

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.arxiv.markup_metrics import strip_math_spans
from kiln.data.decontam.ngram_index import HAN_KANA
from kiln.data.long_documents import FirstPartVerdict

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how a document's language is judged and which are kept
RULES_VERSION = "2026-12-07"

MODES = ("drop", "tag")
SEED = 0  # langdetect's sampling seed for every document
READ_CHARS = 100_000  # of a document's start, where its first 10,000 characters of prose are
UNDETERMINED = "und"  # ISO 639-2's code for "undetermined": too few letters left to judge
MIN_LETTERS = 20  # fewer letters than this in what langdetect reads: undetermined
DENSE_LETTERS = 3  # a Han, kana or Hangul character's weight: 7 of them reach MIN_LETTERS
_LETTER = re.compile(r"[^\W\d_]")
_DENSE = re.compile(f"[{HAN_KANA}\uac00-\ud7af]")  # kana, Han, Hangul syllables
_COMMAND = re.compile(r"\\[A-Za-z@]+\*?|\\.")  # \frac, \section*, \\ ...
_BRACES = re.compile(r"[{}]")


def profile_languages() -> tuple[str, ...]:
    """The language codes langdetect has profiles for ('en', 'de', 'zh-cn', ...)."""
    from langdetect.detector_factory import PROFILES_DIRECTORY

    return tuple(sorted(os.listdir(PROFILES_DIRECTORY)))


@functools.cache
def _factory():
    """langdetect's profiles, loaded once per process (~1 s; not pickled with the filter)."""
    from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(SEED)
    return factory


def prose(text: str) -> str:
    """The text without math spans, LaTeX commands and braces: what a language is read from.
    A `$..$` span stays within a paragraph (TeX's rule): two literal dollars paragraphs apart
    (`$5` ... `$40` on a web page, the latex stage's `$` for `\\$`) took away all the prose
    between them (an English page was judged on "Save 40": Croatian, dropped)."""
    return _BRACES.sub(" ", _COMMAND.sub(" ", strip_math_spans(text, inline_in_paragraph=True)))


def detect_language(text: str, strip_math: bool = True) -> tuple[str, float]:
    """(language code, its probability) by langdetect, seeded; ('und', 0.0) when the text has
    too little to judge (under MIN_LETTERS letters in what langdetect reads: math, commands,
    URLs and e-mails gone)."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _factory().create()
    text = text[:READ_CHARS]
    detector.append(prose(text) if strip_math else text)
    if _letters(detector.text) < MIN_LETTERS:
        return UNDETERMINED, 0.0
    try:
        best = detector.get_probabilities()[0]
    except LangDetectException:
        return UNDETERMINED, 0.0
    return best.lang, float(best.prob)


def _letters(text: str) -> int:
    """Letters in `text` (a Han, kana or Hangul character DENSE_LETTERS), counted up to
    MIN_LETTERS."""
    n = 0
    for m in itertools.islice(_LETTER.finditer(text), MIN_LETTERS):
        n += DENSE_LETTERS if _DENSE.match(m.group()) else 1
        if n >= MIN_LETTERS:
            break
    return n


class LanguageFilter(BaseFilter):
    """Keep documents whose detected language is in `languages` (mode "drop"), or keep every
    document (mode "tag"); both record metadata["language"] and ["language_score"].

    Drop reasons: `other_language` (detected, not wanted) and `undetermined_language` (nothing
    to judge). Stats count each detected language as `language/<code>`.
    """

    name = "🔥 Kiln language"

    def __init__(self, languages: list[str], mode: str = "drop", strip_math: bool = True,
                 exclusion_writer: DiskWriter | None = None):
        super().__init__(exclusion_writer)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.languages = set(languages)
        self.mode = mode
        self.strip_math = strip_math
        self._first = FirstPartVerdict()  # (language, probability) of a cut text's first part

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        held = self._first.of(doc)
        lang, prob = held or detect_language(doc.text, self.strip_math)
        if held is None:
            self._first.keep(doc, (lang, prob))
        doc.metadata["language"] = lang
        doc.metadata["language_score"] = round(prob, 4)
        self.stat_update(f"language/{lang}")
        if self.mode == "tag" or lang in self.languages:
            return True
        return False, "undetermined_language" if lang == UNDETERMINED else "other_language"
