"""Gopher's repetition rules on text with Windows (`\\r\\n`) or old Mac (`\\r`) line endings.

datatrove's GopherRepetitionFilter splits paragraphs on `\\n{2,}` and lines on `\\n+`, text
as its web extraction makes it. Kiln reads .txt and source files as written, and Project
Gutenberg ships its books with `\\r\\n`: there a blank line (`\\r\\n\\r\\n`) split off a line
`\\r`, the same at every paragraph break, so a text of one-line paragraphs (dialogue, a
forum thread) was dropped as duplicate lines (`dup_line_frac`), and no text had two
paragraphs, so the paragraph rules (the code domain's only repetition rules) never fired.
The rules judge the text with its line endings as `\\n`; the text itself is left as written.
"""

from __future__ import annotations

import re

from datatrove.data import Document
from datatrove.pipeline.filters import GopherRepetitionFilter

_LINE_END = re.compile(r"\r\n?")


def unix_newlines(text: str) -> str:
    """`text` with each `\\r\\n` and lone `\\r` as `\\n`."""
    return _LINE_END.sub("\n", text) if "\r" in text else text


class NewlineAwareGopherRepetitionFilter(GopherRepetitionFilter):
    """GopherRepetitionFilter (datatrove's rules and thresholds) judging `unix_newlines` of
    the text."""

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        doc.text = unix_newlines(text)
        try:
            return super().filter(doc)
        finally:
            doc.text = text
