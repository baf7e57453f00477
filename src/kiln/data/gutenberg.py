"""Strip Project Gutenberg's header and licence footer from a book, keeping only its body.

Chronoberg (arXiv:2509.22360, cleaning step 4) strips every book with the pgcorpus /
`gutenberg` "strip headers" approach before concatenating books: without it each book brings
~3,000 words of the same licence, which is both junk and near-duplicate text in every
document. The rule, as that approach (a port of J. Krugel's strip_headers.cpp) runs it:

- header: everything up to and including the *last* start-marker line among the first
  `HEADER_LINES` (600) lines before the footer ("*** START OF THE/THIS PROJECT GUTENBERG EBOOK ... ***", the
  older "*END*THE SMALL PRINT!..." and "*** START OF THE COPYRIGHTED ...");
- footer: from the first end-marker line after the body starts ("*** END OF THE/THIS PROJECT
  GUTENBERG EBOOK ...", "End of (the) Project Gutenberg's ...", "*** END OF THE COPYRIGHTED
  ..."); in a text with no start marker (a part of a long book that `read` cut, a file whose
  header was already removed) only after `FOOTER_MIN_LINE` (100) lines, as the reference
  guards against a title line that names Project Gutenberg;
- the 1990s legal blocks ("<<THIS ELECTRONIC VERSION OF ..." to "... SERVICE THAT CHARGES
  FOR DOWNLOAD ...") are dropped wherever they are.

Where this differs from the reference, on purpose: markers are matched on the line with
leading whitespace removed and case-insensitively (the reference lists indented and
upper-case variants one by one and misses the rest); its looser start markers ("Produced
by", "The Project Gutenberg", "http://www.pgdp.net"...), which it accepts anywhere in the
first 600 lines and which then discard every line before them, are used only for the
producer-credit paragraph that opens the body ("Produced by X and the Online Distributed
Proofreading Team"), so a book whose chapter 1 says "Produced by ..." keeps chapter 1; the
German and French markers are left out (Chronoberg is English). A text with no marker at
all is returned unchanged (the reference re-joins its lines with the OS separator). Books stay
one document each: Chronoberg then concatenates a year's books into one record, which loses
the book boundaries that dedup and Kiln's train/val split (by document) need; group by
metadata["year"] downstream where a per-year record is wanted.

One file per book: Project Gutenberg ships a book as `N-0.txt` (UTF-8), `N.txt` (ASCII) and
`N-8.txt` (8-bit, ISO-8859-1), and Chronoberg reads one, by encoding priority UTF-8 -> ASCII
-> Latin-1. Kiln's `read` reads every UTF-8 file it finds, so a mirror's `N-0.txt` and `N.txt`
(its accents transliterated: not an exact duplicate) were both kept; here a document read
from `N.txt` or `N-8.txt` is dropped (`gutenberg_other_encoding`) when a file of the same book
in a preferred encoding lies beside it (same folder, same compression suffix) within the
prepare's sources (a folder of them, or a file they name: `data.sources = ["pg/12.txt"]` reads
12.txt alone, so a 12-0.txt beside it must not drop it). The digest writes the suffixes the
other way round (`-8` as UTF-8, `-0` as Latin-1); the encoding order is the same, and the
suffixes here are Project Gutenberg's own. A preferred file that exists but
cannot be read would leave the book out: that file's skip is counted by `read`.

The header is what `dating` reads (Title, Author (birth-death), Original publication): it
is kept in metadata["gutenberg_header"] (at most `dating.HEADER_CHARS` characters), where
`dating.date_document` finds it, so `gutenberg` may run before or after `dating`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.dating import GUTENBERG_HEADER_KEY as HEADER_KEY
from kiln.data.dating import HEADER_CHARS as HEADER_KEEP_CHARS  # all of it that dating reads

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# the header / footer markers and what is dropped
RULES_VERSION = "2026-12-07"

HEADER_LINES = 600  # a start marker counts within the first 600 lines (the reference's bound)
FOOTER_MIN_LINE = 100  # with no start marker, an end marker counts from line 100 on

_START = re.compile(
    r"\*{3}\s*START\s+OF\s+(THE|THIS)\s+PROJECT\s+GUTENBERG"
    r"|\*{3}\s*START\s+OF\s+THE\s+COPYRIGHTED"
    r"|\*END\*?\s*THE\s+SMALL\s+PRINT",
    re.IGNORECASE,
)
_END = re.compile(
    r"\*{3}\s*END\s+OF\s+(THE|THIS)\s+PROJECT\s+GUTENBERG"
    r"|\*{3}\s*END\s+OF\s+THE\s+COPYRIGHTED"
    r"|END\s+OF\s+(THE\s+|THIS\s+)?PROJECT\s+GUTENBERG",
    re.IGNORECASE,
)
_LEGAL_START = re.compile(r"<<THIS ELECTRONIC VERSION OF", re.IGNORECASE)
_LEGAL_END = re.compile(r"SERVICE THAT CHARGES FOR DOWNLOAD", re.IGNORECASE)
_CREDIT = re.compile(
    r"(Produced\s+by|E-?text\s+prepared\s+by|This\s+e-?(text|book)\s+was\s+(prepared|produced)\s+by"
    r"|Transcribed\s+from)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Stripped:
    """The body, the header before it ("" when no start marker) and whether a marker was found."""

    body: str
    header: str
    found: bool


# a Project Gutenberg book file: number, encoding suffix, optional compression
_PG_FILE = re.compile(r"(?P<num>\d+)(?P<enc>-0|-8)?(?P<ext>\.txt(?:\.[a-z0-9]+)?)")
ENCODING_ORDER = ("-0", "", "-8")  # UTF-8, ASCII, 8-bit: the first one found is read


def preferred_file(source: str, places: Collection[str] = ()) -> Path | None:
    """A file of the same book in a preferred encoding beside `source`, if there is one (and,
    given `places`, the prepare's sources as `source_places` makes them, one they hold: a
    file they do not name is never read)."""
    path = Path(source)
    m = _PG_FILE.fullmatch(path.name)
    if m is None:
        return None
    mine = ENCODING_ORDER.index(m["enc"] or "")
    for enc in ENCODING_ORDER[:mine]:
        other = path.with_name(f"{m['num']}{enc}{m['ext']}")
        if other.is_file() and (not places or _within(other, places)):
            return other
    return None


def source_places(sources: Sequence[str]) -> frozenset[str]:
    """`sources` as absolute paths, as spelled and with links resolved (a folder named
    through a link is the same folder), made once: a book's check is then a look-up of its
    folders, where a pass over every source made 2,000 listed books take seconds."""
    return frozenset(place(s) for s in sources for place in (os.path.abspath, os.path.realpath))


def _within(path: Path, places: Collection[str]) -> bool:
    """`path` is one of `places` or lies in one of its folders (as the reader walks them)."""
    for where in {os.path.abspath(path), os.path.realpath(path)}:
        while where not in places:
            where, child = os.path.dirname(where), where
            if where == child:  # the root passed: in none of them
                break
        else:
            return True
    return False


def _matches(pattern: re.Pattern[str], line: str) -> bool:
    return pattern.match(line.lstrip()) is not None


def _skip_credit(lines: list[str], start: int, end: int) -> int:
    """Past the producer-credit paragraph when it is the first thing in the body."""
    i = start
    while i < end and not lines[i].strip():
        i += 1
    if i < end and _matches(_CREDIT, lines[i]):
        while i < end and lines[i].strip():
            i += 1
        return i
    return start


def strip_gutenberg(text: str) -> Stripped:
    """The book's body without Project Gutenberg's header, credits, legal blocks and footer."""
    lines = text.splitlines(keepends=True)
    start = 0
    for i, line in enumerate(lines[:HEADER_LINES]):
        if _matches(_START, line):
            start = i + 1
        elif (start or i >= FOOTER_MIN_LINE) and _matches(_END, line):
            break  # the footer: its small print ("*END THE SMALL PRINT!...") starts no body
    first_end = start if start else FOOTER_MIN_LINE
    end = next((i for i in range(first_end, len(lines)) if _matches(_END, lines[i])), len(lines))
    legal = any(_matches(_LEGAL_START, line) for line in lines)
    if not start and end == len(lines) and not legal:
        return Stripped(text, "", False)
    body_start = _skip_credit(lines, start, end) if start else start
    kept, in_legal = [], False
    for line in lines[body_start:end]:
        if _matches(_LEGAL_START, line):
            in_legal = True
        elif in_legal and _LEGAL_END.search(line):
            in_legal = False
        elif not in_legal:
            kept.append(line)
    body = "".join(kept)
    body = re.sub(r"\A(?:[ \t]*(?:\r\n|\r|\n))+", "", body).rstrip()  # blank lines at both ends
    return Stripped(body, "".join(lines[:start])[:HEADER_KEEP_CHARS], True)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class GutenbergStripper(BaseFilter):
    """`strip_gutenberg` as a stage: the text becomes the body, the header goes to
    metadata["gutenberg_header"]; a book with nothing left is dropped (`gutenberg_empty`),
    and so is one read from a file whose book lies beside it in a preferred encoding
    (`gutenberg_other_encoding`: `preferred_file`).
    Stats: `gutenberg_stripped` / `gutenberg_no_markers` documents, `gutenberg_bytes_removed`."""

    name = "📚 Gutenberg header/footer strip"

    def __init__(self, exclusion_writer: DiskWriter | None = None, sources: Sequence[str] = ()):
        super().__init__(exclusion_writer)
        self.sources = list(sources)  # the prepare's data.sources ((): any file beside counts)
        self._places: frozenset[str] | None = None  # made in the task (its working folder)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        source = doc.metadata.get("source")
        if self._places is None:
            self._places = source_places(self.sources)
        if isinstance(source, str) and preferred_file(source, self._places) is not None:
            return False, "gutenberg_other_encoding"
        result = strip_gutenberg(doc.text)
        if not result.found:
            self.stat_update("gutenberg_no_markers")
            return True
        self.stat_update("gutenberg_stripped")
        self.stat_update("gutenberg_bytes_removed",
                         value=_nbytes(doc.text) - _nbytes(result.body))
        if result.header:
            doc.metadata[HEADER_KEY] = result.header
        if not result.body.strip():
            return False, "gutenberg_empty"
        doc.text = result.body
        return True
