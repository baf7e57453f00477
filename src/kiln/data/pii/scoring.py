"""Span-level precision/recall per PII type, for the labelled set and the benchmark.

Matching is one-to-one within a type. `overlap` counts a prediction as correct when it overlaps a
gold span of the same type (boundary slips such as including a title are forgiven); `exact` needs
identical [start, end). Both are reported; the quality targets are judged on overlap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.data.pii.spans import PII_TYPES, Span


@dataclass
class TypeScore:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


def load_labelled(path: Path | str) -> list[dict]:
    """Rows `{id, source, text, spans: [{type, start, end}]}`; checks spans are inside the text."""
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        for s in row["spans"]:
            if s["type"] not in PII_TYPES or not 0 <= s["start"] < s["end"] <= len(row["text"]):
                raise ValueError(f"{path}:{n}: bad span {s}")
        rows.append(row)
    return rows


def _matches(gold: tuple[int, int], pred: tuple[int, int], exact: bool) -> bool:
    return gold == pred if exact else gold[0] < pred[1] and pred[0] < gold[1]


def score(rows: Iterable[dict], detect: Callable[[str], list[Span]], exact: bool = False,
          types: Iterable[str] = PII_TYPES) -> dict[str, TypeScore]:
    """Per-type TP/FP/FN of `detect` against the gold spans of `rows`."""
    scores = {t: TypeScore() for t in types}
    for row in rows:
        text = row["text"]
        preds = detect(text)
        for t, sc in scores.items():
            gold = [(s["start"], s["end"]) for s in row["spans"] if s["type"] == t]
            pred = [(s.start, s.end) for s in preds if s.type == t]
            unmatched = list(gold)
            for p in pred:
                hit = next((g for g in unmatched if _matches(g, p, exact)), None)
                if hit is None:
                    sc.fp += 1
                    sc.errors.append(f"FP {row['id']}: {text[p[0]:p[1]]!r}")
                else:
                    sc.tp += 1
                    unmatched.remove(hit)
            sc.fn += len(unmatched)
            sc.errors.extend(f"FN {row['id']}: {text[g[0]:g[1]]!r}" for g in unmatched)
    return scores
