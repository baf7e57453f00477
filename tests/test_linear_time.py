"""The linear-time check itself: quadratic work fails it, linear work passes it, and time
spent off the CPU (another process holding the cores) does not count."""

from __future__ import annotations

import time

import pytest
from linear_time import FACTOR, assert_linear


def _linear(items: list[int]) -> int:
    return sum(x * x for x in items)


def _quadratic(items: list[int]) -> int:
    return sum(1 for i in range(len(items)) for _ in range(i))


def test_linear_work_passes():
    assert_linear(_linear, lambda n: list(range(n)), 20_000, "sum")


def test_quadratic_work_fails():
    with pytest.raises(AssertionError, match="not linear"):
        assert_linear(_quadratic, lambda n: list(range(n)), 200, "pairs")


def test_waiting_for_the_cpu_is_not_counted():
    """The large input's run is held off the CPU for 40x the small run's time (as when
    another suite takes both cores just then), every time it runs: the wall clock would read
    that as quadratic, the CPU time does not."""
    small_n = 200_000  # over MIN_SMALL_S: the small input is not grown
    start = time.process_time()
    _linear(list(range(small_n)))
    stall = max(0.2, 40 * (time.process_time() - start))

    def stalled(items: list[int]) -> int:
        if len(items) >= FACTOR * small_n:
            time.sleep(stall)
        return _linear(items)

    assert_linear(stalled, lambda n: list(range(n)), small_n, "stalled sum")
