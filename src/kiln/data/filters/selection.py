"""Select documents by a stored score: keep the most surprising ones (surplexity).

Gambetta et al. (arXiv:2410.12341) sort the pool by model perplexity, descending, and keep the
top `ndoc` ("MPP"; here `count`, or a `fraction` of the scored documents); keeping the *least*
surprising documents is their converse, shown to accelerate collapse. A fraction or a count
needs the whole score distribution, so selection is two passes: `PerplexityScorer` writes `ppl`
into metadata (and a writer saves the documents), then `threshold_for_fraction` turns the
collected scores into a threshold and `PerplexitySelector` applies it while streaming (in `kiln
prepare`: `PerplexityThresholds`, one task over every score, writes the threshold(s) to a file
that `StoredThresholdSelector` reads in each task). The digest's caution that the highest
perplexities are often noise is what `mode="drop_extremes"` (a quantile band) is for.

Ties: the selector compares each score with the threshold, so every document tied with the
k-th largest score is kept. The kept count is exactly k when scores are distinct (float
perplexities practically always are); with ties at the threshold it is k plus the extra
tied documents, never fewer than k. The paper's in-memory sort keeps exactly k, breaking ties
by pool order; on purpose we do not: the documents are streamed by `prepare.tasks` shards, so
"pool order" would depend on how the input is sharded, while a threshold keeps the same
documents for any task count. Tied perplexities practically mean identical token sequences,
which `dedup_exact` before selection removes. The parts of a cut text share their text's
score (`perplexity.py`), so they are kept or dropped together; a count counts them as parts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln import strict_json
from kiln.atomic import write_json_atomic

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how thresholds are taken from the scores and applied
RULES_VERSION = "2026-12-07"

MODES = ("top_fraction", "bottom_fraction", "drop_extremes")


def _checked(scores: Iterable[float]) -> np.ndarray:
    arr = np.asarray(list(scores), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no scores given: run the scoring pass first")
    if not np.all(np.isfinite(arr)):
        raise ValueError("scores must be finite numbers (drop unscored documents first)")
    return arr


def _count_for(fraction: float, n: int) -> int:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return math.floor(round(fraction * n, 9))  # round away float noise such as 0.29 * 100


def threshold_for_count(scores: Iterable[float], k: int) -> float:
    """The k-th largest score (keep `score >= threshold`); +inf when k == 0."""
    arr = _checked(scores)
    if not 0 <= k <= arr.size:
        raise ValueError(f"k must be in [0, {arr.size}], got {k}")
    return math.inf if k == 0 else float(np.sort(arr)[::-1][k - 1])


def threshold_for_top(scores: Sequence[float], count: int) -> float:
    """Threshold keeping the top `count` scores, the paper's `ndoc` (see the module note on
    ties); ValueError when fewer documents were scored: the paper's pool always holds ndoc
    documents, and keeping all of a smaller pool would silently change the set's size."""
    arr = _checked(scores)
    if count > arr.size:
        raise ValueError(f"count {count} is more than the {arr.size} scored documents: lower "
                         "prepare.perplexity.count or give more documents")
    return threshold_for_count(arr, count)


def threshold_for_fraction(scores: Sequence[float], fraction: float) -> float:
    """Threshold keeping the top floor(fraction * n) scores (see the module note on ties)."""
    arr = _checked(scores)
    return threshold_for_count(arr, _count_for(fraction, arr.size))


def quantile_band(scores: Sequence[float], low_q: float, high_q: float) -> tuple[float, float]:
    """(low, high) score quantiles (numpy's linear interpolation) for `drop_extremes`."""
    if not 0.0 <= low_q < high_q <= 1.0:
        raise ValueError(f"need 0 <= low_q < high_q <= 1, got {low_q}, {high_q}")
    arr = _checked(scores)
    return float(np.quantile(arr, low_q)), float(np.quantile(arr, high_q))


def scores_from(docs: Iterable[Document], key: str = "ppl") -> list[float]:
    """The scored values under `key` (unscored `None`s skipped), for the threshold helpers."""
    out = []
    for doc in docs:
        if key not in doc.metadata:
            raise KeyError(f"document {doc.id} has no metadata[{key!r}]: run the scorer first")
        if doc.metadata[key] is not None:
            out.append(float(doc.metadata[key]))
    return out


class PerplexitySelector(BaseFilter):
    """Keep documents by their stored score `metadata[key]` (default the scorer's `ppl`).

    - "top_fraction": keep score >= threshold (the paper's MPP filter); pass `threshold`, or
      `fraction` or `count` (the paper's ndoc) and the first pass's `scores`.
    - "bottom_fraction": keep score <= threshold (the paper's converse, for ablations).
    - "drop_extremes": keep low <= score <= high; pass `low`/`high`, or `low_q`/`high_q` and
      `scores`.
    Unscored documents (`None`, e.g. empty text) are dropped as `ppl_missing`.
    """

    name = "🎯 Perplexity selection"

    def __init__(
        self,
        mode: str = "top_fraction",
        *,
        fraction: float | None = None,
        count: int | None = None,
        scores: Sequence[float] | None = None,
        threshold: float | None = None,
        low_q: float | None = None,
        high_q: float | None = None,
        low: float | None = None,
        high: float | None = None,
        key: str = "ppl",
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(exclusion_writer)
        if mode not in MODES:
            raise ValueError(f"unknown selection mode {mode!r}; choose one of {', '.join(MODES)}")
        self.mode, self.key = mode, key
        if mode == "drop_extremes":
            if low_q is not None or high_q is not None:
                if scores is None or low_q is None or high_q is None or low is not None or high is not None:
                    raise ValueError("drop_extremes: give low_q, high_q and scores (or low and high)")
                low, high = quantile_band(scores, low_q, high_q)
            if low is None or high is None or low > high:
                raise ValueError("drop_extremes needs low <= high (or low_q, high_q and scores)")
            self.low, self.high = float(low), float(high)
            return
        if sum(x is not None for x in (threshold, fraction, count)) != 1:
            raise ValueError(f"{mode}: give exactly one of threshold, fraction or count (with "
                             "scores)")
        if threshold is None:
            if scores is None:
                raise ValueError(f"{mode}: a fraction or count needs the scores of the scoring "
                                 "pass")
            sign = 1.0 if mode == "top_fraction" else -1.0
            signed = [sign * s for s in scores]
            threshold = sign * (threshold_for_fraction(signed, fraction) if count is None
                                else threshold_for_top(signed, count))
        self.threshold = float(threshold)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if self.key not in doc.metadata:
            raise KeyError(
                f"document {doc.id} has no metadata[{self.key!r}]: run PerplexityScorer first"
            )
        score = doc.metadata[self.key]
        if score is None:
            return False, "ppl_missing"
        if self.mode == "top_fraction":
            return True if score >= self.threshold else (False, "ppl_below_threshold")
        if self.mode == "bottom_fraction":
            return True if score <= self.threshold else (False, "ppl_above_threshold")
        if score < self.low:
            return False, "ppl_below_band"
        return True if score <= self.high else (False, "ppl_above_band")


class PerplexityThresholds(PipelineStep):
    """One task over every scored document: the selection threshold(s) -> a JSON file.

    The threshold is computed exactly as `PerplexitySelector` does from the scores, so the
    streaming selection afterwards keeps the same documents as an in-memory selection would.
    """

    type = "📊 - SCORER"
    name = "🔥 Kiln perplexity thresholds"

    def __init__(self, mode: str, fraction: float, low_q: float, high_q: float, out: Path,
                 count: int = 0):
        super().__init__()
        self.mode, self.fraction, self.low_q, self.high_q = mode, fraction, low_q, high_q
        self.count = count  # > 0: keep this many (the paper's ndoc), not a fraction
        self.out = Path(out)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError("perplexity thresholds need every score: run with tasks=1")
        scores = scores_from(data or ())
        self.stat_update("scores", value=len(scores))
        if self.mode == "drop_extremes":
            sel = PerplexitySelector(self.mode, scores=scores, low_q=self.low_q, high_q=self.high_q)
            found = {"low": sel.low, "high": sel.high}
        else:
            how = {"count": self.count} if self.count else {"fraction": self.fraction}
            try:  # a count past the scored pool: the user's setting, named (no traceback)
                sel = PerplexitySelector(self.mode, scores=scores, **how)
            except ValueError as e:
                from kiln.errors import RunDataError

                raise RunDataError(f"prepare.perplexity.{next(iter(how))}: {e}") from None
            found = {"threshold": sel.threshold}
        self._refuse_keeping_none(scores, sel)
        write_json_atomic(self.out, {"mode": self.mode, "scores": len(scores), **found})
        return
        yield  # a generator that yields nothing: the documents stay in the intermediate folder


    def _refuse_keeping_none(self, scores: list[float], sel: PerplexitySelector) -> None:
        """A selection that keeps no scored document, refused here, after scoring: it went on
        through every later stage and ended in "no documents" naming no setting (a fraction
        of 0.01 of 50 documents keeps floor(0.5) = 0)."""
        from kiln.errors import RunDataError

        arr = np.asarray(scores, dtype=np.float64)
        kept = ((arr >= sel.low) & (arr <= sel.high) if self.mode == "drop_extremes" else
                arr >= sel.threshold if self.mode == "top_fraction" else arr <= sel.threshold)
        if kept.any():
            return
        n = len(scores)
        if self.mode == "drop_extremes":
            raise RunDataError(
                f"prepare.perplexity.low_q / high_q: the band [{sel.low:.4g}, {sel.high:.4g}] "
                f"holds none of the {n} scored documents: widen it")
        raise RunDataError(
            f"prepare.perplexity.fraction: {self.fraction} of the {n} scored documents keeps "
            f"none (floor({self.fraction} x {n}) = 0): give at least 1/{n} of them, or set "
            "prepare.perplexity.count")


class StoredThresholdSelector(BaseFilter):
    """`PerplexitySelector` with the threshold(s) read, in the worker, from the thresholds file."""

    name = "🎯 Perplexity selection"

    def __init__(self, mode: str, thresholds: Path, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.mode, self.thresholds = mode, Path(thresholds)
        self._selector = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_selector": None}

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if self._selector is None:
            found = strict_json.loads(self.thresholds.read_text(encoding="utf-8"))
            kwargs = ({"low": found["low"], "high": found["high"]} if self.mode == "drop_extremes"
                      else {"threshold": found["threshold"]})
            self._selector = PerplexitySelector(self.mode, **kwargs)
        return self._selector.filter(doc)
