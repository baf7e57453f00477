"""Gopher's document-length bounds judged on the whole text, for the parts the reader cut.

The reader cuts a text over 1,000,000 characters into parts (`kiln.data.long_documents`,
`part_of` = the text's id) so that spaCy's word split fits in memory. Gopher's quality rule
drops a document of over 100,000 words; applied to each part, that bound judged lengths the
cut chose, not the text's: a full part of English prose (~1,000,000 characters, ~160,000
words) always went, and the last part, shorter, was judged alone and could be kept (the end
of a text Gopher drops, without its start). This filter counts the words of a text's parts as
they come (they come one after another from the reader) with the domain's own counter, and
drops *every* part of a text whose total is over the bound, with Gopher's reason
`gopher_long_doc`, as Gopher would drop the whole text; a text within it goes on, its parts'
other rules judged part by part. The minimum (Gopher's 50 words) is the whole text's too
(`min_words`: every part goes, `gopher_short_doc`, when the total is under it): the last part
was whatever followed the last cut, often a few lines, and judged alone by the minimum it
went, so a kept text lost its ending (a 1,000,102-character source file kept without its last
function; the reader now cuts a text's end in halves, so no part is under a quarter of its
limit, but a part's words are still its text's to judge). The domain's own length rule therefore leaves a part's minimum to this filter
(`PartGopherQualityFilter`, `code_rules.CodeLengthFilter`).
Documents that were not cut are not counted here: the domain's own length rule judges them.
It stops counting a text once over the bound, so a long text costs one part's word split.
The parts it holds back are bounded too (`max_held_chars`, 16 parts): a text that long with
at most 100,000 words has over 160 characters a word, a blob (base64, a sequence dump) that
no domain keeps as prose or code, and holding all of it would undo the reader's streaming
(a 20 GB text without spaces is one word a part); its parts go as `long_text_few_words`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.filters import GopherQualityFilter
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.text import PUNCTUATION_SET, split_into_words
from datatrove.utils.typeshelper import Languages

from kiln.data.long_documents import PART_OF, cut_text_of

LONG_REASON = "gopher_long_doc"  # GopherQualityFilter's own reasons: yield reports read the same
SHORT_REASON = "gopher_short_doc"
BLOB_REASON = "long_text_few_words"
MAX_HELD_CHARS = 16_000_000


def gopher_words(text: str) -> int:
    """GopherQualityFilter's count: words (datatrove's English split) with a non-punctuation
    character."""
    return sum(any(ch not in PUNCTUATION_SET for ch in w)
               for w in split_into_words(text, Languages.english))


def is_part(doc: Document) -> bool:
    """Whether `doc` is a part of a text the reader cut (its length is judged here, whole)."""
    return doc.metadata.get(PART_OF) is not None


class WholeTextLengthFilter(BaseFilter):
    """Drop all parts of a cut text of over `max_words` or under `min_words` words (counted by
    `count`, a picklable function) and keep the parts of one within them; documents that were
    not cut pass."""

    name = "📏 Whole-text length"

    def __init__(self, count: Callable[[str], int], max_words: int, min_words: int | None = None,
                 exclusion_writer: DiskWriter | None = None,
                 max_held_chars: int = MAX_HELD_CHARS):
        super().__init__(exclusion_writer)
        self.count, self.max_words, self.max_held_chars = count, max_words, max_held_chars
        self.min_words = min_words
        self._verdicts: dict[str, bool | tuple[bool, str]] = {}

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        return super().run(self._judged(data or ()), rank, world_size)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return self._verdicts.pop(doc.id, True)

    def _judged(self, data: DocumentsPipeline) -> Iterator[Document]:
        """The documents in order; a text's parts held back until its verdict is known."""
        held: list[Document] = []
        text, words, chars, over = None, 0, 0, None
        for doc in data:
            of = cut_text_of(doc)  # (source, part_of): two sources named alike
            if of is None or of != text:
                yield from self._ended(held, words)  # the previous text ended under the maximum
                text, words, chars, over = of, 0, 0, None
                if of is None:
                    yield doc
                    continue
            if over is not None:  # already judged: no need to count
                yield from self._release([doc], (False, over))
                continue
            words += self.count(doc.text)
            chars += len(doc.text)
            held.append(doc)
            if words > self.max_words:
                over = LONG_REASON
                self.stat_update("texts_over_max_words")
            elif chars > self.max_held_chars:
                over = BLOB_REASON
                self.stat_update("texts_over_max_held_chars")
            if over is not None:
                yield from self._release(held, (False, over))
        yield from self._ended(held, words)

    def _ended(self, held: list[Document], words: int) -> Iterator[Document]:
        """The parts of a text that ended under the maximum, judged by the minimum (none held:
        no text, or one already judged)."""
        if held and self.min_words is not None and words < self.min_words:
            self.stat_update("texts_under_min_words")
            yield from self._release(held, (False, SHORT_REASON))
        else:
            yield from self._release(held, True)

    def _release(self, held: list[Document], verdict: bool | tuple[bool, str]) -> Iterator[Document]:
        for doc in held:
            self._verdicts[doc.id] = verdict
            yield doc
        held.clear()


class PartGopherQualityFilter(GopherQualityFilter):
    """GopherQualityFilter that judges a part's other rules but not its length: the part's
    text is judged by `WholeTextLengthFilter`. A part still needs one word (a last part of
    blank lines or punctuation goes, `gopher_short_doc`): Gopher's ratios divide by it."""

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if not is_part(doc):
            return super().filter(doc)
        bounds = self.min_doc_words, self.max_doc_words
        self.min_doc_words, self.max_doc_words = 1, None
        try:
            return super().filter(doc)
        finally:
            self.min_doc_words, self.max_doc_words = bounds
