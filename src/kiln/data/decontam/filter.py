"""Decontamination as datatrove steps: build the n-gram index once, then filter or tag documents.

Run `BuildDecontaminationIndex` as its own one-task stage (the filter stage `depends` on it), so a
cluster run builds the index once and every filter task loads the same file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.decontam.ngram_index import (
    DEFAULT_ANSWER_FIELDS,
    DEFAULT_PROMPT_FIELDS,
    NGramIndex,
    normalize_tokens,
)
from kiln.data.long_documents import cut_text_of

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# which documents a benchmark n-gram match drops or tags
RULES_VERSION = "2026-12-07"

BENCHMARKS_KEY = "contamination_benchmarks"  # sorted names of the benchmarks matched
MATCHES_KEY = "contamination_ngrams"  # n-gram positions of the doc found in any benchmark index


class BuildDecontaminationIndex(PipelineStep):
    """Build the n-gram index from benchmark JSONL files and save it atomically (one task only)."""

    type = "🦠 - DECONT"
    name = "🔥 Kiln n-gram index"

    def __init__(
        self,
        benchmarks: Mapping[str, Path | str] | Iterable[Path | str],
        output_path: Path | str,
        n: int = 13,
        prompt_fields: Sequence[str] = DEFAULT_PROMPT_FIELDS,
        answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
        include_prompt: bool = True,
        index: NGramIndex | None = None,
        pii_types: Sequence[str] | None = None,
    ):
        """`index`: one already built from these settings (the stage validates the benchmarks
        by building it), saved instead of built again. `pii_types`: see `NGramIndex.build`."""
        super().__init__()
        self.index = index
        self.benchmarks = dict(benchmarks) if isinstance(benchmarks, Mapping) else list(benchmarks)
        self.output_path = Path(output_path)
        self.n = n
        self.prompt_fields = tuple(prompt_fields)
        self.answer_fields = tuple(answer_fields)
        self.include_prompt = include_prompt
        self.pii_types = None if pii_types is None else tuple(pii_types)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError("build the decontamination index with tasks=1 (it writes one file)")
        index = self.index if self.index is not None else NGramIndex.build(
            self.benchmarks, self.n, self.prompt_fields, self.answer_fields, self.include_prompt,
            self.pii_types,
        )
        index.save(self.output_path)
        for name in index.names:
            self.stat_update(f"items/{name}", value=index.info[name]["items"])
            self.stat_update(f"ngrams/{name}", value=index.info[name]["ngrams"])
            self.stat_update(f"too_short_items/{name}", value=index.info[name]["too_short_items"])
        if data:
            yield from data


class DecontaminationFilter(BaseFilter):
    """Drop (mode="drop") or only tag (mode="tag") documents sharing any n-gram with the index.

    Every document gets `contamination_benchmarks` (list) and `contamination_ngrams` (int) in its
    metadata, so tagged runs can decide later and dropped ones (via exclusion_writer) are auditable.
    Stats: `contaminated`, `contaminated/<benchmark>`, and datatrove's kept/dropped counts.
    """

    type = "🦠 - DECONT"
    name = "🔥 Kiln n-gram decontaminate"

    def __init__(
        self,
        index_path: Path | str,
        mode: Literal["drop", "tag"] = "drop",
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(exclusion_writer)
        if mode not in ("drop", "tag"):
            raise ValueError(f"mode must be 'drop' or 'tag', got {mode!r}")
        self.index_path = Path(index_path)
        self.mode = mode
        self._index: NGramIndex | None = None  # loaded in the worker, not pickled with the step
        # (cut text, part number, its last n - 1 words) of the part before: an n-gram across
        # the cut lies in neither part alone, and a leak there was missed
        self._tail: tuple[tuple, int, list[str]] | None = None

    @property
    def index(self) -> NGramIndex:
        if self._index is None:
            self._index = NGramIndex.load(self.index_path)
        return self._index

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_index"] = state["_tail"] = None
        return state

    def _with_part_before(self, doc: Document) -> tuple[list[str], int]:
        """`doc`'s words, after the last n - 1 words of the part before it where it is the
        next part of a cut text (parts follow one another in a task); how many were put
        before. The tail is kept for the part after."""
        tokens = normalize_tokens(doc.text)
        text, number = cut_text_of(doc), doc.id.rpartition("#")[2]
        if text is None or not number.isdigit():
            self._tail = None
            return tokens, 0
        tail = self._tail[2] if self._tail and self._tail[:2] == (text, int(number) - 1) else []
        joined = tail + tokens
        self._tail = (text, int(number), joined[max(0, len(joined) - (self.index.n - 1)):])
        return joined, len(tail)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        tokens, before = self._with_part_before(doc)
        counts = self.index.match_counts(tokens, skip=before)
        doc.metadata[BENCHMARKS_KEY] = sorted(counts)
        doc.metadata[MATCHES_KEY] = sum(counts.values())
        if not counts:
            return True
        self.stat_update("contaminated")
        for name in counts:
            self.stat_update(f"contaminated/{name}")
        if self.mode == "tag":
            self.stat_update("tagged")
            return True
        return False, "contaminated"
