"""The per-op step timer accounts for the ops a step runs, and no more time than it took."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from step_profile import OpTimer, profile_step  # noqa: E402


def test_timer_counts_each_op_once_and_within_the_wall_time():
    a, b = torch.randn(64, 32, requires_grad=True), torch.randn(32, 16)

    def step():
        (a @ b).relu().sum().backward()

    start = time.perf_counter()
    timer, wall = profile_step(step, steps=3)
    elapsed = time.perf_counter() - start
    calls: dict[str, int] = {}
    for key, n in timer.calls.items():
        calls[key[0]] = calls.get(key[0], 0) + n
    assert calls["mm"] == 3 * 2  # forward a @ b and backward dL/da = g @ b^T, each step
    assert calls["relu"] == 3 and calls["threshold_backward"] == 3
    mm_shapes = {key[1] for key in timer.seconds if key[0] == "mm"}
    assert ((64, 32), (32, 16)) in mm_shapes and ((64, 16), (16, 32)) in mm_shapes
    assert 0 < sum(timer.seconds.values()) <= elapsed
    assert 0 < wall * 3 <= elapsed


def test_by_op_sums_shapes_and_sorts_by_time():
    timer = OpTimer()
    timer.seconds.update({("mm", ((1,),), ()): 1.0, ("mm", ((2,),), ()): 2.0,
                          ("add", ((1,),), ()): 4.0})
    assert list(timer.by_op().items()) == [("add", 4.0), ("mm", 3.0)]


def test_the_benchmark_runs_end_to_end(capsys):
    """The script itself, not only its timer: it builds the trainer's step and prints its
    RESULT line (a changed Runner signature once broke it while these tests passed)."""
    from step_profile import main

    main(["--quick", "--steps", "1", "--precision", "fp32"])
    assert "RESULT" in capsys.readouterr().out
