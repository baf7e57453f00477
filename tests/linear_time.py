"""Linear-time checks that a loaded machine does not fail: the time of 8x the input against
the time of 1x, measured back to back. No absolute time is asserted; a quadratic scan gives
a ratio near 64, linear work near 8 (less where a fixed cost dominates). The time is this
process's CPU time, not the wall clock: while another process holds the cores (two test
suites on 2 cores) the wall clock runs on and the CPU time does not, so a burst of load
during the large run alone no longer reads as 30x."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
FACTOR = 8
SLACK = 3.0  # linear work passes up to 24x; quadratic (64x) fails, n log n (~9x) passes
MIN_SMALL_S = 0.005


def _best_seconds(run: Callable[[T], object], arg: T, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run(arg)
        best = min(best, time.process_time() - start)
    return best


def assert_linear(run: Callable[[T], object], make: Callable[[int], T], n: int,
                  what: object = "") -> None:
    """`run(make(FACTOR * n))` takes under SLACK * FACTOR times `run(make(n))` (inputs made
    before timing; the small one best of three). An `n` whose run takes under MIN_SMALL_S is
    grown 4x at a time first: below that, timer noise and caches dominate the ratio. Over
    the bound, both are timed once more and the best of each kept: a burst of load during
    the one large run alone fails no test, a quadratic scan fails both times."""
    small_in = make(n)
    small = _best_seconds(run, small_in, 3)
    while small < MIN_SMALL_S:
        n *= 4
        small_in = make(n)
        small = _best_seconds(run, small_in, 3)
    large_in = make(FACTOR * n)
    large = _best_seconds(run, large_in, 1)
    if large >= SLACK * FACTOR * small:
        small = min(small, _best_seconds(run, small_in, 3))
        large = min(large, _best_seconds(run, large_in, 1))
    assert large < SLACK * FACTOR * small, (
        f"{what}: {FACTOR}x the input took {large / small:.1f}x the time "
        f"({small * 1e3:.1f} -> {large * 1e3:.1f} ms): not linear")
