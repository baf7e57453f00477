"""The plain-function API: `detect_pii(text)` and `redact(text)`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from kiln.data.pii.context import drop_examples
from kiln.data.pii.credentials import find_passwords, find_usernames
from kiln.data.pii.names import find_names
from kiln.data.pii.network import find_emails, find_ips
from kiln.data.pii.secrets import find_keys
from kiln.data.pii.spans import PII_TYPES, Span, apply_redaction, resolve_overlaps

DETECTORS: dict[str, Callable[[str], Iterator[Span]]] = {
    "KEY": find_keys,
    "USERNAME": find_usernames,
    "EMAIL": find_emails,
    "PASSWORD": find_passwords,
    "NAME": find_names,
    "IP_ADDRESS": find_ips,
}


def check_types(types: Iterable[str] | None) -> tuple[str, ...]:
    """The chosen PII types (None: all six; one name alone is that type, not its letters, which
    were each refused as an unknown type: `['E', 'M', 'A', 'I', 'L']`); ValueError naming any
    unknown one."""
    if types is None:
        return PII_TYPES
    chosen = (types,) if isinstance(types, str) else tuple(types)
    unknown = [t for t in chosen if t not in PII_TYPES]
    if unknown:
        raise ValueError(f"unknown PII types {unknown}; choose from {PII_TYPES}")
    return chosen


def detect_pii(text: str, types: Iterable[str] | None = None) -> list[Span]:
    """All PII spans in `text` (non-overlapping, sorted by start) for the chosen types.

    Overlaps are resolved over all six types before filtering to `types`, so asking for a subset
    never turns e.g. a password's inner `@host` into an email. Values the text shows as
    examples are not PII (`kiln.data.pii.context`).
    """
    if not isinstance(text, str):
        raise TypeError(f"detect_pii expects str, got {type(text).__name__}")
    chosen = check_types(types)
    spans = [span for detector in DETECTORS.values() for span in detector(text)]
    return [s for s in drop_examples(text, resolve_overlaps(spans)) if s.type in chosen]


def redact(text: str, types: Iterable[str] | None = None) -> tuple[str, dict[str, int]]:
    """Replace PII by typed placeholders (`<EMAIL>` …; an IP address by a private one); return
    the text and per-type counts.

    Idempotent: placeholders and private addresses are never themselves detected, so redacting
    twice changes nothing.
    """
    return apply_redaction(text, detect_pii(text, types))
