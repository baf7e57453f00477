"""Number formatting for humans: 21.3M parameters, 1.2 GFLOP, 3m 07s."""

from __future__ import annotations

import math
from typing import Any

_SI = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_COUNT = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")]


def as_number(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _scaled(value: float, units: list[tuple[float, str]], sep: str, suffix: str) -> str:
    for scale, prefix in units:
        if abs(value) >= scale:
            return f"{value / scale:.1f}{sep}{prefix}{suffix}"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{text}{sep}{suffix}" if suffix else text


def fmt_count(value: Any) -> str:
    """A count such as parameters or tokens: ``21.3M``, ``1.2B``."""
    n = as_number(value)
    return "—" if n is None else _scaled(n, _COUNT, "", "")


def fmt_flops(value: Any) -> str:
    """Floating-point operations with an SI prefix: ``1.2 GFLOP``."""
    n = as_number(value)
    return "—" if n is None else _scaled(n, _SI, " ", "FLOP")


def fmt_bytes(value: Any) -> str:
    """A byte count with a decimal prefix: ``12.3 MB``."""
    n = as_number(value)
    return "—" if n is None else _scaled(n, _SI, " ", "B")


def fmt_float(value: Any, digits: int = 4) -> str:
    """A float with fixed ``digits``; ints and text pass through unchanged."""
    n = as_number(value)
    if n is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{n:.{digits}f}"


def fmt_duration(seconds: Any) -> str:
    """Seconds as ``2h 05m 07s`` / ``3m 07s`` / ``4.2s``."""
    s = as_number(seconds)
    if s is None or not math.isfinite(s):
        return "—"
    if s < 60:
        return f"{s:.1f}s"
    total = int(round(s))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def fmt_value(value: Any) -> str:
    """Any JSON value for a table cell: exact ints with separators, short floats."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value) if value else "[]"
    return str(value)


def flat_rows(data: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested mapping as (dotted.key, formatted value) rows, in file order."""
    rows: list[tuple[str, str]] = []
    for key, value in data.items():
        label = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(flat_rows(value, f"{label}."))
        else:
            rows.append((label, fmt_value(value)))
    return rows
