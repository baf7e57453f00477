"""Heuristic quality filters per domain, built from datatrove's Gopher / C4 / FineWeb filters.

The web-text rules are tuned for HTML-extracted prose; applied unchanged they delete most
LaTeX (C4's `{` rule, Gopher's symbol and alphabetic-word ratios) and most source code (line
punctuation, sentences, stop words). Each domain therefore gets its own configuration:

- ``prose``: FineWeb's filters as FineWeb configured them (datatrove's `examples/fineweb.py`):
  Gopher repetition, Gopher quality, C4 quality and FineWeb quality, in that order, each with
  its published defaults but for C4's terminal-punctuation line rule, which FineWeb turned off
  (`filter_no_terminal_punct=False`: in the FineWeb paper it removed too many tokens; on
  hard-wrapped text, a paragraph over many lines, it deleted every line but each paragraph's
  last). C4QualityFilter still *edits* the text: it removes lines with < 3 words (blank lines
  too: paragraphs are joined), mentioning javascript or cookie/terms-of-use phrases, or with
  a > 1000-character word, and strips `[1]`-style citations.
- ``latex``: Gopher repetition (defaults); Gopher quality without the `#`/ellipsis-per-word
  ratio (`#1` macro arguments) and without the 80 %-alphabetic-words rule (math tokens);
  C4 reduced to its document-level rules (lorem ipsum, >= 5 sentences) plus dropping lines
  with a > 1000-character word: no `{` rule and none of the line removals (they would cut
  equations, `\\begin{...}` lines and `[1]` macro arities out of the source). FineWeb quality
  is left out: its line statistics (terminal punctuation share, 1 % duplicate-line chars)
  describe web-page lines, not hard-wrapped markup where `\\end{equation}` repeats legitimately.
  C4's rewrite of the text is undone but for those long-word lines (`LatexC4Filter`): it
  stripped every line, which took the indentation out of the ``` code blocks the LaTeX
  converter keeps exactly as written (a Python listing's indentation is its meaning).
- ``code``: only rules that make sense for code: Gopher's *paragraph* repetition rules
  (duplicate blank-line-separated blocks <= 30 % of blocks and <= 20 % of characters: a file
  of repeated blocks is generated or data, not code) and the document length bounds of Gopher
  quality (>= 50 and <= 100 000 words, counted as runs of word characters by
  `code_rules.CodeLengthFilter`: datatrove's spaCy word split cost most of the time on code;
  shorter files are re-export stubs). The
  *line* repetition rules are off: at Gopher's thresholds they dropped 7 of 300 sampled
  stdlib modules (ipaddress.py, mailbox.py, weakref.py, numbers.py: repeated docstring quotes,
  `return NotImplemented` and indentation), so a file of one line repeated with no blank
  line passes. Word n-gram repetition, stop words, word length, symbol ratios, C4 and
  FineWeb are prose statistics and are left out.

In every domain a text the reader cut into parts (over 1,000,000 characters: `part_of`) is
judged by the length bounds as a whole, first (`text_length.WholeTextLengthFilter`): all its
parts go when the text has over 100,000 words, as Gopher drops the whole document (any
English prose text that long has ~160,000), where each part judged alone lost every full
part and could keep the last, shorter one; and under 50 (a blob), where the last part, often
a few lines, judged alone went and left a kept text without its end. Its parts' other rules
are judged part by part.

Everything here runs offline: English word and sentence splitting uses `spacy.blank("en")`
plus a rule-based sentencizer (the `spacy` package, no model download).
"""

from __future__ import annotations

from collections.abc import Callable

from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.filters.code_rules import CodeLengthFilter, CodeRepetitionFilter, code_words
from kiln.data.filters.line_endings import NewlineAwareGopherRepetitionFilter
from kiln.data.filters.text_length import (
    PartGopherQualityFilter,
    WholeTextLengthFilter,
    gopher_words,
)

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# the filters and their thresholds per domain (\r\n line endings counted as one)
RULES_VERSION = "2026-12-07"

DOMAINS = ("prose", "latex", "code")
MAX_WORDS = 100_000  # Gopher's document-length bounds (GopherQualityFilter's max_doc_words
MIN_WORDS = 50  # and min_doc_words)

ExclusionWriters = Callable[[str], DiskWriter] | None


def _check_offline() -> None:
    try:
        import spacy  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "datatrove's English word/sentence splitting needs the `spacy` package "
            "(it uses spacy.blank('en'), no model download): pip install spacy"
        ) from e


class MeasuredC4QualityFilter(C4QualityFilter):
    """C4QualityFilter that also counts the UTF-8 bytes of the documents it keeps before and
    after its line removals (`edited_bytes_in` / `edited_bytes_out`): a document whose lines
    are mostly short (< 3 words) or mention javascript (a JavaScript tutorial) is kept with
    most of it deleted, which no drop count shows (`yield.json` `edited`)."""

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        before = len(doc.text.encode("utf-8"))
        result = super().filter(doc)
        if result is True:
            self.stat_update("edited_bytes_in", value=before)
            self.stat_update("edited_bytes_out", value=len(doc.text.encode("utf-8")))
        return result


class LatexC4Filter(C4QualityFilter):
    """C4's document rules and its long-word line removal, with every other line as written:
    C4QualityFilter rewrites a kept text as its lines stripped, joined by newlines."""

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        original = doc.text
        result = super().filter(doc)
        if result is True:
            limit = self.max_word_length
            doc.text = "".join(  # C4's lines (`splitlines`: a \r or \f ends one too)
                line for line in original.splitlines(keepends=True)
                if limit == -1 or not any(len(word) > limit for word in line.split()))
        return result


def _prose(ex: Callable[[str], DiskWriter | None]) -> list[PipelineStep]:
    return [
        WholeTextLengthFilter(gopher_words, MAX_WORDS, MIN_WORDS, exclusion_writer=ex("long_text")),
        NewlineAwareGopherRepetitionFilter(exclusion_writer=ex("gopher_repetition")),
        PartGopherQualityFilter(exclusion_writer=ex("gopher_quality")),
        MeasuredC4QualityFilter(filter_no_terminal_punct=False, exclusion_writer=ex("c4_quality")),
        FineWebQualityFilter(exclusion_writer=ex("fineweb_quality")),
    ]


def _latex(ex: Callable[[str], DiskWriter | None]) -> list[PipelineStep]:
    return [
        WholeTextLengthFilter(gopher_words, MAX_WORDS, MIN_WORDS, exclusion_writer=ex("long_text")),
        NewlineAwareGopherRepetitionFilter(exclusion_writer=ex("gopher_repetition")),
        PartGopherQualityFilter(
            max_symbol_word_ratio=None, max_non_alpha_words_ratio=None,
            exclusion_writer=ex("gopher_quality"),
        ),
        LatexC4Filter(
            filter_curly_bracket=False, filter_no_terminal_punct=False, min_words_per_line=-1,
            remove_citations=False, filter_javascript=False, filter_policy=False,
            exclusion_writer=ex("c4_quality"),
        ),
    ]


def _code(ex: Callable[[str], DiskWriter | None]) -> list[PipelineStep]:
    return [
        WholeTextLengthFilter(code_words, MAX_WORDS, MIN_WORDS, exclusion_writer=ex("long_text")),
        CodeRepetitionFilter(exclusion_writer=ex("gopher_repetition")),
        CodeLengthFilter(min_words=MIN_WORDS, max_words=MAX_WORDS, exclusion_writer=ex("gopher_quality")),
    ]


def quality_filters(domain: str, exclusion_writer: ExclusionWriters = None) -> list[PipelineStep]:
    """The quality filters for `domain` ("prose", "latex" or "code"), ready for an executor.

    `exclusion_writer(filter_name)` may return a datatrove writer per filter (e.g. a
    JsonlWriter into `removed/<filter_name>`) so rejected documents are kept for yield audits.
    """
    builders = {"prose": _prose, "latex": _latex, "code": _code}
    if domain not in builders:
        raise ValueError(f"unknown quality domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    _check_offline()
    return builders[domain](exclusion_writer or (lambda name: None))
