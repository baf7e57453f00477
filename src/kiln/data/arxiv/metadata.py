"""Stream an arXiv OAI metadata snapshot and keep papers worth fetching, before any archive is read.

Rules (arXiv-to-Model digest, step 1): a category in `categories` (an entry ``math`` matches the
archive ``math`` and its sub-categories ``math.CO``..., never ``math-ph``); first-version year >=
`min_year`; abstract >= `min_abstract_words` whitespace words; ``withdrawn`` not in `comments`.
Drops are counted by reason; malformed lines are counted, never fatal.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.data.arxiv.ids import id_year

DEFAULT_CATEGORIES = ("math", "cs", "hep-th", "hep-ph", "quant-ph", "stat.ML", "stat.TH")
YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")


def category_matches(categories: str | list[str], wanted: Iterable[str]) -> bool:
    """True if any listed category is a wanted one or a sub-category of a wanted archive."""
    cats = categories.split() if isinstance(categories, str) else list(categories)
    wanted = tuple(wanted)
    return any(c == w or c.startswith(w + ".") for c in cats for w in wanted)


def first_version_year(record: dict) -> int | None:
    """Year of the first version's `created` date, else `update_date`, else the id's yymm."""
    versions = record.get("versions") or []
    if versions and isinstance(versions[0], dict):
        if m := YEAR.search(str(versions[0].get("created", ""))):
            return int(m.group(1))
    if m := YEAR.search(str(record.get("update_date") or "")):
        return int(m.group(1))
    return id_year(str(record.get("id", "")))


def metadata_drop_reason(
    record: dict,
    categories: Iterable[str] = DEFAULT_CATEGORIES,
    min_year: int = 1995,
    min_abstract_words: int = 20,
) -> str | None:
    """None if the record is kept, else the first failing rule's name."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return "bad_record"
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
        opener = gzip.open if self.snapshot.endswith(".gz") else open
        kept = 0
        with opener(self.snapshot, "rb") as f:
            for i, line in enumerate(f):
                if i % world_size != rank or not line.strip():
                    continue
                self.stat_update("metadata/read")
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
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
