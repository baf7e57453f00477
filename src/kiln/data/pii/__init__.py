"""Typed PII detection and redaction (Key, Username, Email, Password, Name, IP Address).

Plain functions `detect_pii` / `redact`, and `PIIRedactor`, a datatrove step. Taxonomy and
realness policy follow arXiv:2512.07814 (see /work/shared/papers/pii-leakage.md); emails and IPv4
reuse datatrove's PIIFormatter patterns (see `network.py` for why it is wrapped, not called).
"""

from kiln.data.pii.detect import DETECTORS, detect_pii, redact
from kiln.data.pii.spans import PII_TYPES, Span, placeholder, replacement, resolve_overlaps
from kiln.data.pii.step import PIIRedactor

__all__ = ["DETECTORS", "PII_TYPES", "PIIRedactor", "Span", "detect_pii", "placeholder", "redact", "replacement",
           "resolve_overlaps"]
