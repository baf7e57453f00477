"""The code domain's two document rules, without datatrove's spaCy word split.

datatrove's `GopherRepetitionFilter` splits every document into words (spaCy) before it
looks at which rules are on, and `GopherQualityFilter` does the same to count words. On
source files that split is nearly all the cost (it made 25 of the quickstart's ~40 s of
quality + PII work per task on the standard library), yet the code domain uses no word
statistic but a length bound. These filters keep Gopher's paragraph/line repetition rules
exactly (datatrove's own splitting and counting) and count words as runs of word
characters (`\\w+`: identifiers, keywords, numbers), which is what a length bound on code
needs. Rejection reasons are Gopher's, so yield reports read the same.
"""

from __future__ import annotations

import re

from datatrove.data import Document
from datatrove.pipeline.filters import GopherRepetitionFilter
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.filters.line_endings import unix_newlines
from kiln.data.filters.text_length import is_part

_WORD = re.compile(r"\w+")


class CodeRepetitionFilter(GopherRepetitionFilter):
    """Gopher's duplicate paragraph and line rules (datatrove's thresholds and counting);
    no word n-gram rules, so no word split."""

    name = "👯 Code Repetition"

    def __init__(self, dup_line_frac: float | None = None, dup_para_frac: float | None = 0.3,
                 dup_line_char_frac: float | None = None, dup_para_char_frac: float | None = 0.2,
                 exclusion_writer: DiskWriter | None = None):
        super().__init__(dup_line_frac=dup_line_frac, dup_para_frac=dup_para_frac,
                         dup_line_char_frac=dup_line_char_frac,
                         dup_para_char_frac=dup_para_char_frac, top_n_grams=(), dup_n_grams=(),
                         exclusion_writer=exclusion_writer)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = unix_newlines(doc.text)  # a `\r\n` file's blank lines split its blocks too
        if not text:
            return False, "empty"
        checks = (
            ("para", self.paragraph_exp.split(text.strip()), self.dup_para_frac,
             self.dup_para_char_frac),
            ("line", self._line_splitter.split(text), self.dup_line_frac, self.dup_line_char_frac),
        )
        for unit, parts, frac, char_frac in checks:
            if not (frac or char_frac):
                continue
            duplicates, chars = find_duplicates(parts)
            if frac and duplicates / len(parts) > frac:
                return False, f"dup_{unit}_frac"
            if char_frac and chars / len(text) > char_frac:
                return False, f"dup_{unit}_char_frac"
        return True


def code_words(text: str) -> int:
    """Words of code: runs of `\\w` characters (identifiers, keywords, numbers)."""
    return len(_WORD.findall(text))


class CodeLengthFilter(BaseFilter):
    """Keep documents with min_words..max_words words (runs of `\\w` characters). A part of
    a cut text passes: `text_length.WholeTextLengthFilter` judges its whole text (its last
    part, a file's closing lines, may have no word at all)."""

    name = "📏 Code Length"

    def __init__(self, min_words: int | None = 50, max_words: int | None = 100_000,
                 exclusion_writer: DiskWriter | None = None):
        super().__init__(exclusion_writer)
        self.min_words, self.max_words = min_words, max_words

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if is_part(doc):
            return True
        n = code_words(doc.text)
        if self.min_words is not None and n < self.min_words:
            return False, "gopher_short_doc"
        if self.max_words is not None and n > self.max_words:
            return False, "gopher_long_doc"
        return True
