"""Hedges' g: the standardised difference of two independent samples' means, corrected for
small samples (papers/brain-rot.md: g > 0.3 between junk and control arms is non-trivial;
its "health check" alerts past 0.3 in the bad direction)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# |g| beyond this is a non-trivial difference (brain-rot's threshold)
NON_TRIVIAL_G = 0.3


def hedges_g(a: Sequence[float], b: Sequence[float]) -> float:
    """(mean(a) - mean(b)) / s_pooled x J, with s_pooled^2 = ((n1-1) s1^2 + (n2-1) s2^2) /
    (n1 + n2 - 2) (s^2: the (n-1)-weighted sample variances) and J = 1 - 3 / (4 (n1+n2) - 9).
    Positive when `a`'s mean is the larger. Raises ValueError for an arm of fewer than 2
    values, a value that is not finite, or a pooled SD of 0 (g is undefined there)."""
    for name, xs in (("first", a), ("second", b)):
        if len(xs) < 2:
            raise ValueError(f"Hedges' g needs at least 2 values per sample; the {name} has "
                             f"{len(xs)}")
        if not all(math.isfinite(x) for x in xs):
            raise ValueError(f"Hedges' g: the {name} sample holds a value that is not finite")
    n1, n2 = len(a), len(b)
    m1, m2 = math.fsum(a) / n1, math.fsum(b) / n2
    ss1 = math.fsum((x - m1) ** 2 for x in a)
    ss2 = math.fsum((x - m2) ** 2 for x in b)
    pooled = math.sqrt((ss1 + ss2) / (n1 + n2 - 2))
    if pooled == 0:
        raise ValueError("Hedges' g is undefined: both samples are constant (pooled SD 0)")
    correction = 1 - 3 / (4 * (n1 + n2) - 9)
    return (m1 - m2) / pooled * correction
