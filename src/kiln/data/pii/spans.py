"""Typed PII spans, deterministic overlap resolution and placeholder redaction.

The six types follow the code-PII taxonomy of arXiv:2512.07814 (Key, Username, Email, Password,
Name, IP Address); placeholders follow bigcode's `<NAME> <EMAIL> <KEY> <PASSWORD>` style, and an
IP address becomes a private one (bigcode's and the digest's format-preserving fake), so code that
parses or connects to it still reads as code.
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
from dataclasses import dataclass

PII_TYPES: tuple[str, ...] = ("KEY", "USERNAME", "EMAIL", "PASSWORD", "NAME", "IP_ADDRESS")

# When two detections overlap with equal length, the earlier type here wins. Keys and passwords
# first: leaking a credential is worse than leaking the identity around it.
TYPE_PRIORITY: dict[str, int] = {t: i for i, t in enumerate(
    ("KEY", "PASSWORD", "EMAIL", "IP_ADDRESS", "USERNAME", "NAME"))}


# Private addresses (RFC 1918, RFC 4193): never PII under our policy, so redaction stays idempotent.
# A pool, not a hash of the address into 10/8: a fake must say next to nothing about the original
# (16 choices leak at most 4 bits), while one address keeps one fake across a corpus.
FAKE_IPV4 = tuple(f"{net}.{host}" for net in ("10.0.0", "10.17.3", "172.16.8", "192.168.1")
                  for host in (12, 37, 104, 201))
# Each IPv6 fake's last group holds a letter: next to a left-over `.d.d.d` it cannot read as an
# IPv4 octet.
FAKE_IPV6 = tuple(f"fd{a:02x}:{b:x}::{host:x}" for a, b in ((0x12, 0x3a4), (0x7c, 0x51e))
                  for host in (0x1a, 0x3c, 0x10b, 0x2e1, 0x3c8, 0x4d0, 0x5ee, 0x7ab))


def placeholder(pii_type: str) -> str:
    """The typed token that replaces a span of a non-IP type, e.g. `<EMAIL>`."""
    return f"<{pii_type}>"


def replacement(span: Span) -> str:
    """What a span becomes: its typed placeholder, or for an IP address a private address of
    the same family picked by the original's hash (the same address always gets the same fake,
    however it is spelled: `2001:db8::1` and `2001:DB8:0:0:0:0:0:1` are one address)."""
    if span.type != "IP_ADDRESS":
        return placeholder(span.type)
    pool = FAKE_IPV6 if ":" in span.text else FAKE_IPV4
    try:
        key = ipaddress.ip_address(span.text).packed
    except ValueError:  # not parseable alone (a caller's own span): its spelling
        key = span.text.lower().encode()
    digest = hashlib.blake2b(key, digest_size=2).digest()
    return pool[int.from_bytes(digest, "big") % len(pool)]


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
    # kept spans are disjoint, so sorted by start they are sorted by end too: a new span can
    # only overlap its neighbours there (checking every kept span was O(k^2): a log of 8000
    # lines with an address each took seconds)
    starts: list[int] = []
    kept: list[Span] = []
    for span in ranked:
        i = bisect.bisect_left(starts, span.start)
        if i > 0 and kept[i - 1].overlaps(span) or i < len(kept) and kept[i].overlaps(span):
            continue
        starts.insert(i, span.start)
        kept.insert(i, span)
    return kept


def apply_redaction(text: str, spans: list[Span]) -> tuple[str, dict[str, int]]:
    """Replace each (non-overlapping) span by its `replacement`; return new text and per-type counts."""
    counts = dict.fromkeys(PII_TYPES, 0)
    pieces: list[str] = []
    pos = 0
    for span in sorted(spans, key=lambda s: s.start):
        if span.start < pos:
            raise ValueError(f"overlapping spans passed to apply_redaction at {span.start}")
        if text[span.start:span.end] != span.text:
            raise ValueError(f"span text mismatch at {span.start}: {span.text!r}")
        pieces.append(text[pos:span.start])
        pieces.append(replacement(span))
        counts[span.type] += 1
        pos = span.end
    pieces.append(text[pos:])
    return "".join(pieces), counts
