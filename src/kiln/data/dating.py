"""Date documents (metadata["year"]) and select training periods, as datatrove steps.

Order of evidence (first that gives a year wins; metadata["year_method"] says which):
1. "metadata": a year field (int or 4-digit string) or a date field starting with YYYY
   (0 or less, or after this year, is a placeholder: no year).
2. "arxiv": the identifier — new style YYMM.NNNN(N) (April 2007 on) -> 20YY; old style
   archive/YYMMNNN (1991 - March 2007; one of arXiv's own archive names) -> 19YY if YY >= 91
   else 20YY. Read from a record's `arxiv_id`, `id`, `url` or own `source` (`record_source`),
   and from the document id only when that id is itself an arXiv identifier (as the arXiv
   readers make it): Kiln's ids for files are their paths, and a numbered file
   (`books/0001023.txt`) is not a paper from January 2000.
3. "majority_vote": Chronoberg's rule (arXiv:2509.22360, code L-4-r-s/ChronoBerg). Each source
   gives at most one candidate, every candidate must lie in the first author's life
   (birth < year <= death, no upper bound when the death year is unknown; no check when the
   birth year is unknown: there Kiln only keeps candidates between 1450 and this year, since
   the free-text sources would otherwise date "I wrote 2500 words" to 2500 and "created 1200
   jobs" to 1200; nothing is dated after this year in any case), and the label is the most
   common candidate. The 100-year rule (year - birth <= 100 when the death year is unknown) is
   Chronoberg's selection filter on that label, not a candidate check: a vote it fails leaves
   the document undated (its year in metadata["year_rejected"]), as Chronoberg leaves the book
   out, rather than dating it by a minority candidate that passes. Its "no translator" filter
   is applied the same way: a translated book (a `translators` / `translator` field in
   metadata, or a "Translator:" line in a Gutenberg header) is left undated
   (metadata["year_rejected_reason"] = "translated"): the voted year is the original's, while
   its words are the translator's, of another time. Sources, in tie-break order
   (Chronoberg's are wikipedia, open_library and title; original_publication and text are
   Kiln's, for a Gutenberg file read with no catalogue record):
     wikipedia     mode of the 4-digit numbers in the first line of metadata["wikipedia_summary"],
                   else mode of years after published/created/wrote/written in
                   metadata["wikipedia_text"]; mode taken first, then the lifetime check (as the
                   reference code does)
     open_library  mode of metadata["open_library_years"] (first_publish_year of each hit),
                   hits outside the life dropped before the mode
     original_publication  first year on a Gutenberg "Original publication:" header line
     title         first 4-digit number in the title (metadata["title"] or "Title:" header)
     text          mode of years after published/created/wrote/written in the document text,
                   years outside the life dropped before the mode
   Tie-break: equal counts go to the source listed first — the released Chronoberg catalogue
   shows Wikipedia beating Open Library on 1-1 ties (e.g. Kennedy's address: 1961 vs 1962 -> 1961).
   Within one source's mode, equal counts go to the year seen first (Python's statistics.mode).
A book whose header the `gutenberg` stage stripped is read from metadata["gutenberg_header"],
where that stage keeps it; the "text" source then reads the body alone, not the licence.
Gutenberg "Release Date:"/"Posting Date:" are e-text dates, never the writing date: they are
recorded as metadata["gutenberg_release_year"] only.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from statistics import mode

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.long_documents import cut_text_of

# the versions of the stages' rules (kiln.data.stage_rules): bump one with any change to
# the evidence read and the votes: dating's
DATING_RULES_VERSION = "2026-12-07"
# which dated documents a period keeps: period's
PERIOD_RULES_VERSION = "2026-12-07"

# The five Chronoberg intervals (VAD lexicons and sequential training use these).
CHRONOBERG_PERIODS: dict[str, tuple[int, int]] = {
    "1750-1799": (1750, 1799),
    "1800-1849": (1800, 1849),
    "1850-1899": (1850, 1899),
    "1900-1949": (1900, 1949),
    "1950-2000": (1950, 2000),
}
VOTE_SOURCES = ("wikipedia", "open_library", "original_publication", "title", "text")
YEAR_FIELDS = ("year",)
DATE_FIELDS = ("date", "publication_date", "published", "created")
ARXIV_FIELDS = ("arxiv_id", "id", "url", "record_source")
# the old-style (archive/YYMMNNN) archive names; any other word before a slash is not arXiv
ARXIV_OLD_ARCHIVES = (
    "acc-phys", "adap-org", "alg-geom", "ao-sci", "astro-ph", "atom-ph", "bayes-an", "chao-dyn",
    "chem-ph", "cmp-lg", "comp-gas", "cond-mat", "cs", "dg-ga", "funct-an", "gr-qc", "hep-ex",
    "hep-lat", "hep-ph", "hep-th", "math", "math-ph", "mtrl-th", "nlin", "nucl-ex", "nucl-th",
    "patt-sol", "physics", "plasm-ph", "q-alg", "q-bio", "quant-ph", "solv-int", "supr-con",
)
# the earliest year a candidate may name when the author's lifetime is unknown (printing)
EARLIEST_UNBOUNDED_YEAR = 1450
HEADER_CHARS = 20_000  # Gutenberg headers sit at the top of the file
GUTENBERG_HEADER_KEY = "gutenberg_header"  # where the `gutenberg` stage keeps the header

_FOUR_DIGITS = re.compile(r"(?<!\d)(\d{4})(?!\d)")
# the "text" source's rule, line by line (`_verb_years` finds its matches in linear time)
_VERB_YEAR = re.compile(
    r"(?:published|created|wrote|written)\D*?(?<!\d)(\d{4})(?!\d)", re.IGNORECASE
)
_VERB = re.compile(r"published|created|wrote|written", re.IGNORECASE)  # _VERB_YEAR's own
_DIGITS = re.compile(r"\d+")
_ARXIV_NEW = re.compile(r"(?<![\d.])(\d{2})(\d{2})\.(\d{4,5})(?:v\d+)?(?![\d])")
_ARXIV_OLD = re.compile(
    rf"(?<![A-Za-z-])({'|'.join(map(re.escape, ARXIV_OLD_ARCHIVES))})(?:\.[A-Z]{{2}})?/"
    r"(\d{2})(\d{2})(\d{3})(?!\d)"
)
_ARXIV_BARE = re.compile(r"(?:arxiv:)?\s*[\w.-]*/?\d{4}\.?\d{3,5}(?:v\d+)?", re.IGNORECASE)
_HEADER = re.compile(
    r"^[ \t]*(Title|Author|Translator|Release Date|Posting Date|Original publication)[ \t]*:"
    r"[ \t]*(.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_LIFESPAN = re.compile(r"(?<!\d)(\d{3,4})\s*[-–]\s*(\d{3,4})?(?!\d)")


def arxiv_year(identifier: str) -> int | None:
    """Year of the first valid arXiv identifier inside `identifier` (e.g. a path or URL)."""
    for m in _ARXIV_NEW.finditer(identifier):
        yy, mm, num = int(m.group(1)), int(m.group(2)), m.group(3)
        # 4-digit numbers: 0704..1412; 5-digit: 1501 onwards
        if 1 <= mm <= 12 and (yy, mm) >= (7, 4) and (len(num) == 5) == (yy >= 15):
            return 2000 + yy
    for m in _ARXIV_OLD.finditer(identifier):
        yy, mm = int(m.group(2)), int(m.group(3))
        if 1 <= mm <= 12 and (yy >= 91 or (yy, mm) <= (7, 3)):
            return 1900 + yy if yy >= 91 else 2000 + yy
    return None


def parse_gutenberg_header(text: str) -> dict:
    """title, author, birth/death (from "Author: Name (1812-1870)"), translator, release_year,
    original_year."""
    out: dict = {}
    for m in _HEADER.finditer(text[:HEADER_CHARS]):
        key, value = m.group(1).lower(), m.group(2).strip()
        if key in out or key.replace(" ", "_") in out:
            continue
        if key == "title":
            out["title"] = value
        elif key == "author":
            out["author"] = value
            if span := _LIFESPAN.search(value):
                out["birth"] = int(span.group(1))
                if span.group(2):
                    out["death"] = int(span.group(2))
        elif key in ("release date", "posting date"):
            if "release_year" not in out and (y := _FOUR_DIGITS.search(value)):
                out["release_year"] = int(y.group(1))
        elif key == "translator" and value:
            out["translator"] = value
        elif key == "original publication" and "original_year" not in out and (
                y := _FOUR_DIGITS.search(value)):
            out["original_year"] = int(y.group(1))
    return out


def in_lifetime(year: int, birth: int | None, death: int | None) -> bool:
    """Chronoberg's selection rule for a book's label (birth < year <= death, or <= birth + 100
    with no death year); with no birth year, EARLIEST_UNBOUNDED_YEAR <= year. Never after
    this year."""
    if not candidate_in_life(year, birth, death):
        return False
    return birth is None or death is not None or year - birth <= 100


def candidate_in_life(year: int, birth: int | None, death: int | None) -> bool:
    """Chronoberg's check on each source's candidate: birth < year <= death, no upper bound
    with no death year (the reference code's `pd.isna(death) or year <= death`); with no birth
    year, EARLIEST_UNBOUNDED_YEAR <= year. Never after this year."""
    if year > datetime.date.today().year:
        return False
    if birth is None:
        return year >= EARLIEST_UNBOUNDED_YEAR
    return birth < year and (death is None or year <= death)


def _verb_years(text: str) -> list[int]:
    """`_VERB_YEAR.findall` of each line, in time linear in the text: the regex's `\\D*?` ran
    from each verb to the line's next digit, so a long line with many verbs and no digit
    (a text with no line breaks) was quadratic (144,000 characters: 19 s). A verb's year is
    the first run of digits after it on its line, where that run is four digits long; a
    verb inside a span already matched is skipped, as findall does."""
    years = []
    for line in text.split("\n"):
        runs = None
        pos = 0  # the end of the last match
        for verb in _VERB.finditer(line):
            if verb.start() < pos:
                continue
            if runs is None:  # the line's digit runs, listed once
                runs = [(m.start(), m.end()) for m in _DIGITS.finditer(line)]
                starts = [start for start, _ in runs]
            i = bisect.bisect_left(starts, verb.end())
            if i == len(runs):  # no digit after this verb, nor after any later one
                break
            start, end = runs[i]
            if end - start == 4:
                years.append(int(line[start:end]))
                pos = end
    return years


def _int_or_none(value: object) -> int | None:
    """A year as a record holds it: an int, a whole float (a pandas column with a missing
    value is float: 1850.0, NaN) or a 3-4 digit string ("1850", "1850.0")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(\d{3,4})(?:\.0*)?\s*", value)):
        return int(m.group(1))
    return None


def _recorded_year(value: object) -> int | None:
    """A year a record states (`_int_or_none`), or None for a placeholder: 0 or less (a
    catalogue's "unknown", MySQL's zero date 0000-00-00) or after this year (9999), which
    dated the document to it, out of every period even with `keep_undated`."""
    year = _int_or_none(value)
    return year if year is not None and 0 < year <= datetime.date.today().year else None


def _life_year(value: object) -> int | None:
    """An author's birth or death year a record states: before the common era it is
    negative (Gutendex gives Homer -750..-650), a real year that keeps a translation's
    modern years out of his life; 0 and a year after this one are placeholders."""
    year = _int_or_none(value)
    return year if year is not None and year != 0 and year <= datetime.date.today().year else None


def vote_candidates(
    text: str, metadata: dict, birth: int | None, death: int | None, header: dict | None = None
) -> dict[str, int]:
    """{source: candidate year} after the lifetime rule, for the sources in VOTE_SOURCES."""
    header = parse_gutenberg_header(text) if header is None else header
    found: dict[str, int] = {}
    summary = metadata.get("wikipedia_summary")
    wiki = None
    if isinstance(summary, str) and (years := _FOUR_DIGITS.findall(summary.split("\n")[0])):
        wiki = int(mode(years))
    elif isinstance(metadata.get("wikipedia_text"), str) and (
        years := _verb_years(metadata["wikipedia_text"])
    ):
        wiki = mode(years)
    if wiki is not None and candidate_in_life(wiki, birth, death):
        found["wikipedia"] = wiki
    hits = [y for y in (_int_or_none(v) for v in metadata.get("open_library_years") or []) if y]
    if hits := [y for y in hits if candidate_in_life(y, birth, death)]:
        found["open_library"] = mode(hits)
    if (y := header.get("original_year")) and candidate_in_life(y, birth, death):
        found["original_publication"] = y
    title = metadata.get("title") if isinstance(metadata.get("title"), str) else header.get("title")
    if title and (m := _FOUR_DIGITS.search(title)) and candidate_in_life(int(m.group(1)), birth, death):
        found["title"] = int(m.group(1))
    if years := [y for y in _verb_years(text) if candidate_in_life(y, birth, death)]:
        found["text"] = mode(years)
    return found


def majority_vote(candidates: dict[str, int], order: Sequence[str] = VOTE_SOURCES) -> int | None:
    """Most common candidate year; ties go to the year of the earliest source in `order`."""
    if not candidates:
        return None
    counts = Counter(candidates.values())
    best = max(counts.values())
    for source in order:
        if source in candidates and counts[candidates[source]] == best:
            return candidates[source]
    raise ValueError(
        f"candidate sources {sorted(candidates)} not in the tie-break order {list(order)}"
    )


def _lifetime(metadata: dict, header: dict) -> tuple[int | None, int | None]:
    birth = _life_year(metadata.get("author_birth_year"))
    death = _life_year(metadata.get("author_death_year"))
    if birth is None:
        birth, death = header.get("birth"), header.get("death")
    return birth, death


def date_document(doc: Document) -> dict:
    """The dating fields for `doc` (year, year_method, year_candidates, ...); year may be absent."""
    md = doc.metadata
    for key in YEAR_FIELDS:
        if (y := _recorded_year(md.get(key))) is not None:
            return {"year": y, "year_method": "metadata"}
    for key in DATE_FIELDS:
        if isinstance(md.get(key), str) and (m := re.match(r"\s*(\d{4})(?!\d)", md[key])) and (
                y := _recorded_year(m.group(1))) is not None:
            return {"year": y, "year_method": "metadata"}
    bare_id = [doc.id] if isinstance(doc.id, str) and _ARXIV_BARE.fullmatch(doc.id) else []
    for value in [md.get(k) for k in ARXIV_FIELDS] + bare_id:
        if isinstance(value, str) and (y := arxiv_year(value)) is not None:
            return {"year": y, "year_method": "arxiv"}
    stored = md.get(GUTENBERG_HEADER_KEY)  # the header the `gutenberg` stage took off the text
    header = parse_gutenberg_header(stored if isinstance(stored, str) else doc.text)
    birth, death = _lifetime(md, header)
    candidates = vote_candidates(doc.text, md, birth, death, header)
    out: dict = {"year_candidates": candidates}
    if "release_year" in header:
        out["gutenberg_release_year"] = header["release_year"]
    if birth is not None:
        out["author_birth_year"] = birth
    if death is not None:
        out["author_death_year"] = death
    year = majority_vote(candidates)
    if year is not None and translated(md, header):  # Chronoberg: no translator
        out.update(year_rejected=year, year_rejected_reason="translated")
    elif year is not None and in_lifetime(year, birth, death):
        out.update(year=year, year_method="majority_vote")
    elif year is not None:  # over 100 years after a birth with no death year: left out
        out.update(year_rejected=year, year_rejected_reason="over_100_years_after_birth")
    return out


def translated(metadata: dict, header: dict) -> bool:
    """A translator named in the catalogue record (`translators` / `translator`, a name or a
    non-empty list) or in the Gutenberg header."""
    for key in ("translators", "translator"):
        value = metadata.get(key)
        if (isinstance(value, str) and value.strip()) or (isinstance(value, list) and any(value)):
            return True
    return bool(header.get("translator"))


class DateDocuments(PipelineStep):
    """Set metadata["year"] (+ year_method, candidates) on every document it can date.

    The parts of a text `read` cut (metadata["part_of"], kiln.data.long_documents) are one
    book: each is dated as the first of them that reaches this step, since only the first
    holds the header (its author's lifetime, `Translator:` line, original publication).
    Dated alone, a long translated book's later parts got the year their text named and
    passed a period filter, and an untranslated one's were left undated and dropped. The
    reader yields a text's parts one after another, so one text is remembered at a time."""

    type = "🕰 - DATING"
    name = "🔥 Kiln dating"

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        text, first = None, {}  # the cut text last dated, and its first part's fields
        for doc in data or []:
            with self.track_time():
                part_of = cut_text_of(doc)  # (source, part_of): two sources named alike
                if part_of is not None and part_of == text:
                    fields = copy.deepcopy(first)
                else:
                    fields = date_document(doc)
                    if part_of is not None:  # a document between parts (a replica) keeps it
                        text, first = part_of, copy.deepcopy(fields)
                doc.metadata.update(fields)
                self.stat_update(
                    f"dated/{fields['year_method']}" if "year" in fields else "undated"
                )
                if "year_rejected" in fields:
                    self.stat_update(f"undated/{fields['year_rejected_reason']}")
            yield doc


def _resolve_periods(periods: Iterable[tuple[int, int] | str]) -> list[tuple[int, int]]:
    out = []
    for p in periods:
        if isinstance(p, str):
            if p not in CHRONOBERG_PERIODS:
                raise ValueError(
                    f"unknown period {p!r}; use one of {list(CHRONOBERG_PERIODS)} or (start, end)"
                )
            out.append(CHRONOBERG_PERIODS[p])
        else:
            start, end = p
            if start > end:
                raise ValueError(f"period {p} starts after it ends")
            out.append((int(start), int(end)))
    if not out:
        raise ValueError("no periods given")
    return out


class PeriodFilter(BaseFilter):
    """Keep documents whose metadata["year"] lies in one of the inclusive `periods`.

    periods: (start, end) pairs or Chronoberg bucket names ("1800-1849"). Undated documents are
    dropped (reason "undated") unless keep_undated.
    """

    name = "🔥 Kiln period filter"

    def __init__(
        self,
        periods: Iterable[tuple[int, int] | str],
        keep_undated: bool = False,
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(exclusion_writer)
        self.periods = _resolve_periods(periods)
        self.keep_undated = keep_undated

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        year = _recorded_year(doc.metadata.get("year"))
        if year is None:
            return True if self.keep_undated else (False, "undated")
        if any(a <= year <= b for a, b in self.periods):
            return True
        return False, "out_of_period"
