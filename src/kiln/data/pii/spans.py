"""Typed PII spans, deterministic overlap resolution and placeholder redaction.

The six types follow the code-PII taxonomy of arXiv:2512.07814 (Key, Username, Email, Password,
Name, IP Address); placeholders follow bigcode's `<NAME> <EMAIL> <KEY> <PASSWORD>` style.
"""

from __future__ import annotations

from dataclasses import dataclass

PII_TYPES: tuple[str, ...] = ("KEY", "USERNAME", "EMAIL", "PASSWORD", "NAME", "IP_ADDRESS")

# When two detections overlap with equal length, the earlier type here wins. Keys and passwords
# first: leaking a credential is worse than leaking the identity around it.
TYPE_PRIORITY: dict[str, int] = {t: i for i, t in enumerate(
    ("KEY", "PASSWORD", "EMAIL", "IP_ADDRESS", "USERNAME", "NAME"))}


def placeholder(pii_type: str) -> str:
    """The typed token that replaces a span, e.g. `<EMAIL>`."""
    return f"<{pii_type}>"


@dataclass(frozen=True, order=True)
class Span:
    """One detection: `text[start:end]` is PII of `type`."""

    type: str
    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        if self.type not in PII_TYPES:
            raise ValueError(f"unknown PII type {self.type!r}; expected one of {PII_TYPES}")
        if not 0 <= self.start < self.end:
            raise ValueError(f"bad span [{self.start}, {self.end}) for {self.type}")

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


def resolve_overlaps(spans: list[Span]) -> list[Span]:
    """Keep a non-overlapping subset, deterministically: longest span first, then type priority,
    then leftmost; the result is sorted by start. Identical input sets give identical output
    whatever their order."""
    ranked = sorted(set(spans), key=lambda s: (-(s.end - s.start), TYPE_PRIORITY[s.type], s.start))
    kept: list[Span] = []
    for span in ranked:
        if not any(span.overlaps(k) for k in kept):
            kept.append(span)
    return sorted(kept, key=lambda s: s.start)


def apply_redaction(text: str, spans: list[Span]) -> tuple[str, dict[str, int]]:
    """Replace each (non-overlapping) span by its placeholder; return new text and per-type counts."""
    counts = dict.fromkeys(PII_TYPES, 0)
    pieces: list[str] = []
    pos = 0
    for span in sorted(spans, key=lambda s: s.start):
        if span.start < pos:
            raise ValueError(f"overlapping spans passed to apply_redaction at {span.start}")
        if text[span.start:span.end] != span.text:
            raise ValueError(f"span text mismatch at {span.start}: {span.text!r}")
        pieces.append(text[pos:span.start])
        pieces.append(placeholder(span.type))
        counts[span.type] += 1
        pos = span.end
    pieces.append(text[pos:])
    return "".join(pieces), counts
