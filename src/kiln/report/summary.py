"""Headline figures of a run, computed from its metric records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kiln.report.fmt import as_number
from kiln.report.metrics_io import records_of_kind


@dataclass
class Summary:
    """What a reader wants first: where the run ended and how fast it got there."""

    last_step: int | None = None
    final_train_loss: float | None = None
    best_val_bpb: float | None = None
    best_val_step: int | None = None
    total_tokens: float | None = None
    mean_tokens_per_s: float | None = None
    wall_time_s: float | None = None
    diverged_step: int | None = None  # the step whose loss or weights were not finite
    diverged_what: str = ""


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    return [v for v in (as_number(r.get(key)) for r in records) if v is not None]


def _late_throughput(train: list[dict[str, Any]]) -> float | None:
    """Tokens over training time in the records of the second half of the steps: each
    record's window holds the tokens since the previous record, trained in tokens /
    tokens_per_s seconds (validation and checkpoints left out). Not the mean of the
    records' rates, which a short slow window would weigh like a long one."""
    middle = (train[0]["step"] + train[-1]["step"]) / 2
    tokens = seconds = 0.0
    before = 0.0
    for r in train:
        now, rate = as_number(r.get("tokens")), as_number(r.get("tokens_per_s"))
        if now is None:
            continue
        if r["step"] >= middle and rate and now > before:
            tokens, seconds = tokens + now - before, seconds + (now - before) / rate
        before = now
    return tokens / seconds if seconds else None


def summarize(records: list[dict[str, Any]]) -> Summary:
    """Summarise train and val records; fields without data stay None.

    Throughput is taken over the second half of the step range, so the slow first steps
    (compilation, warm caches) do not drag it down.
    """
    train = records_of_kind(records, "train")
    val = records_of_kind(records, "val")
    out = Summary()
    if train:
        out.last_step = train[-1]["step"]
        losses = [r for r in train if as_number(r.get("loss")) is not None]
        if losses:
            out.final_train_loss = float(losses[-1]["loss"])
        tokens = _values(train, "tokens")
        out.total_tokens = max(tokens) if tokens else None
        elapsed = _values(train, "elapsed_s")
        out.wall_time_s = max(elapsed) if elapsed else None
        out.mean_tokens_per_s = _late_throughput(train)
    diverged = records_of_kind(records, "diverged")  # the trainer logs it as it stops
    if diverged:
        out.diverged_step, out.diverged_what = diverged[-1]["step"], str(diverged[-1].get("what", ""))
    # a diverged run logs nan: the best is the best finite figure
    scored = [r for r in val if (v := as_number(r.get("val_bpb"))) is not None and math.isfinite(v)]
    if scored:
        best = min(scored, key=lambda r: r["val_bpb"])
        out.best_val_bpb, out.best_val_step = float(best["val_bpb"]), best["step"]
    return out
