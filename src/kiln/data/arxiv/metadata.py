"""Stream an arXiv OAI metadata snapshot and keep papers worth fetching, before any archive is read.

Rules (arXiv-to-Model digest, step 1): a category in `categories` (an entry ``math`` matches the
archive ``math`` and its sub-categories ``math.CO``..., never ``math-ph``); first-version year >=
`min_year`; abstract >= `min_abstract_words` whitespace words; ``withdrawn`` not in `comments`.
Drops are counted by reason; malformed lines and records (a field of the wrong type:
``bad_<field>``) are counted, never fatal. A snapshot cut off or damaged mid-file fails the run
naming the file: it is sorted by id, so keeping what came before would silently drop the newest
papers.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.data.arxiv.ids import id_year
from kiln.errors import ConfigError

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# which papers are kept (categories, year, abstract words)
RULES_VERSION = "2026-12-07"

DEFAULT_CATEGORIES = ("math", "cs", "hep-th", "hep-ph", "quant-ph", "stat.ML", "stat.TH")
YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
TEXT_FIELDS = ("title", "abstract", "comments")  # a string, null or absent


def category_matches(categories: str | list[str], wanted: Iterable[str]) -> bool:
    """True if any listed category is a wanted one or a sub-category of a wanted archive.

    Deliberately not the digest's code (`any(c in categories for c in allowed)`, a substring
    test on the categories string): that also keeps `math-ph` ("math") and every `physics.*`
    paper ("cs" in "physics"), which the category list does not mean."""
    cats = categories.split() if isinstance(categories, str) else list(categories)
    wanted = tuple(wanted)
    return any(c == w or c.startswith(w + ".") for c in cats for w in wanted)


def first_version_year(record: dict) -> int | None:
    """Year of the first version: its `created` date (the Kaggle snapshot's `versions[0]`, or
    the OAI arXiv format's top-level `created`), else the id's yymm (the month the first
    version was submitted), else `update_date`.

    `update_date` is the date of the *last* version or metadata change, so it comes last: read
    before the id, a 1993 paper revised in 2009 passed a 1995 `min_year`."""
    versions = record.get("versions") or []
    if versions and isinstance(versions[0], dict):
        if m := YEAR.search(str(versions[0].get("created", ""))):
            return int(m.group(1))
    if m := YEAR.search(str(record.get("created") or "")):
        return int(m.group(1))
    if (year := id_year(str(record.get("id", "")))) is not None:
        return year
    if m := YEAR.search(str(record.get("update_date") or "")):
        return int(m.group(1))
    return None


def malformed_field(record: dict) -> str | None:
    """The first field whose type the rules cannot read (a bad record, not a filtered paper)."""
    cats = record.get("categories")
    if cats is not None and not isinstance(cats, str) and not (
            isinstance(cats, list) and all(isinstance(c, str) for c in cats)):
        return "categories"
    if not isinstance(record.get("versions") or [], list):
        return "versions"
    return next((k for k in TEXT_FIELDS if not isinstance(record.get(k) or "", str)), None)


def metadata_drop_reason(
    record: dict,
    categories: Iterable[str] = DEFAULT_CATEGORIES,
    min_year: int = 1995,
    min_abstract_words: int = 20,
) -> str | None:
    """None if the record is kept, else the first failing rule's name."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return "bad_record"
    if bad := malformed_field(record):
        return f"bad_{bad}"
    if not category_matches(record.get("categories") or "", categories):
        return "category"
    if "withdrawn" in str(record.get("comments") or "").lower():
        return "withdrawn"
    year = first_version_year(record)
    if year is None or year < min_year:
        return "year"
    if len(str(record.get("abstract") or "").split()) < min_abstract_words:
        return "abstract_short"
    return None


class ArxivMetadataFilter(PipelineStep):
    """Reader: metadata snapshot (JSON lines, optionally .gz) -> one Document per kept paper.

    Line i goes to rank i % world_size. Each Document has id = arXiv id, text = abstract and
    metadata {arxiv_id, title, abstract, year, categories}, for `ArxivSourceReader`.
    """

    type = "📖 - READER"
    name = "🔥 arXiv metadata filter"

    def __init__(
        self,
        snapshot: str,
        categories: Iterable[str] = DEFAULT_CATEGORIES,
        min_year: int = 1995,
        min_abstract_words: int = 20,
        limit: int = 0,
    ):
        super().__init__()
        self.snapshot = str(snapshot)
        self.categories = tuple(categories)
        self.min_year = min_year
        self.min_abstract_words = min_abstract_words
        self.limit = limit

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if data:
            yield from data
        kept = 0
        for i, line in enumerate(self._lines()):
            if i % world_size != rank or not line.strip():
                continue
            self.stat_update("metadata/read")
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # also non-UTF-8, a 5,000-digit number
                self.stat_update("metadata/dropped/bad_json")
                continue
            reason = metadata_drop_reason(
                record, self.categories, self.min_year, self.min_abstract_words
            )
            if reason:
                self.stat_update(f"metadata/dropped/{reason}")
                continue
            self.stat_update("metadata/kept")
            yield self._document(record)
            kept += 1
            if self.limit and kept >= self.limit:
                return

    def _lines(self) -> Iterator[bytes]:
        """The snapshot's lines; a cut-off or damaged file is a ConfigError naming it."""
        opener = gzip.open if self.snapshot.endswith(".gz") else open
        n = 0
        try:
            with opener(self.snapshot, "rb") as f:
                for line in f:
                    n += 1
                    yield line
        except (EOFError, OSError, zlib.error) as exc:
            raise ConfigError(
                f"prepare.arxiv.snapshot: {self.snapshot} is cut off or damaged after line {n} "
                f"({type(exc).__name__}: {exc}); download it again") from exc

    def _document(self, record: dict) -> Document:
        cats = record.get("categories") or ""
        abstract = " ".join(str(record.get("abstract") or "").split())
        return Document(
            text=abstract,
            id=record["id"],
            metadata={
                "arxiv_id": record["id"],
                "title": " ".join(str(record.get("title") or "").split()),
                "abstract": abstract,
                "year": first_version_year(record),
                "categories": cats.split() if isinstance(cats, str) else list(cats),
            },
        )
