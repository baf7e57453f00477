"""Hedges' g: the standardised difference of two independent samples' means, corrected for
small samples (papers/brain-rot.md: g > 0.3 between junk and control arms is non-trivial;
its "health check" alerts past 0.3 in the bad direction).

Beside it, for two runs scored on the same windows (paired samples, which g ignores), the
paired view: the mean per-window difference with its 95% paired-t interval, and d_z (that
mean over the differences' SD). A t interval, not a bootstrap: it is exact for normal
differences and, by the central limit theorem, close for the hundreds to millions of
windows an eval scores; it needs no seed and costs one pass, where a bootstrap of a
million windows would cost thousands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

# the paired interval's coverage
CONFIDENCE = 0.95

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


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom: Abramowitz & Stegun 26.7.3
    (odd df) and 26.7.4 (even df), finite sums in cos(theta), theta = atan(t / sqrt(df))."""
    theta = math.atan(t / math.sqrt(df))
    c2, term = math.cos(theta) ** 2, 1.0
    if df % 2:
        total = 0.0 if df == 1 else 1.0
        for k in range(3, df - 1, 2):  # the (2 4 ... (k-1)) / (1 3 ... k) cos^(k-1) terms
            term *= c2 * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    total = 1.0
    for k in range(2, df - 1, 2):  # the (1 3 ... (k-1)) / (2 4 ... k) cos^k terms
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = `confidence` (`df` degrees of freedom): bisection on the exact
    CDF up to 1,000 df; past that the Cornish-Fisher expansion (A&S 26.7.5, to 1/df^4: off
    by < 1e-12 there), where the exact sums would take df / 2 terms."""
    if df > 1000:
        z = NormalDist().inv_cdf((1 + confidence) / 2)
        return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
                + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z)
                / (92160 * df**4))
    low, high = 0.0, 1.0
    while t_cdf_two_sided(high, df) < confidence:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf_two_sided(mid, df) < confidence else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class PairedDifference:
    """a - b window by window: their mean, its 95% paired-t interval, and d_z = mean / SD of
    the differences (None when they are all equal: no spread to standardise by)."""

    n: int
    mean: float
    low: float
    high: float
    d_z: float | None


def paired_difference(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float],
                      ) -> PairedDifference:
    """The paired view of `a` and `b` (the same windows, in the same order): differences
    d_i = a_i - b_i, mean m, SD s (n-1 weights), interval m -/+ t(0.975, n-1) s / sqrt(n),
    d_z = m / s. ValueError for unequal lengths, fewer than 2 pairs or a value not finite."""
    if len(a) != len(b):
        raise ValueError(f"a paired difference needs as many values in each sample; "
                         f"{len(a)} vs {len(b)}")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"a paired difference needs at least 2 pairs; there are {len(d)}")
    if not np.isfinite(d).all():
        raise ValueError("a paired difference: a value is not finite")
    n, mean = len(d), float(d.mean())
    sd = float(np.sqrt(np.square(d - mean).sum() / (n - 1)))
    half = t_quantile(CONFIDENCE, n - 1) * sd / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half, mean / sd if sd else None)
