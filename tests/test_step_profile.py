"""The per-op step timer accounts for the ops a step runs, and no more time than it took."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from step_profile import GEMMS, OpTimer, profile_step, summary  # noqa: E402


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


def test_summary_counts_gemms_by_name_and_shares_the_op_time():
    timer = OpTimer()
    timer.seconds.update({("mm", ((4, 8), (8, 2)), ()): 1.0, ("mm", ((2, 2), (2, 2)), ()): 2.0,
                          ("addmm", (), ()): 0.5, ("bmm", (), ()): 0.25,
                          ("baddbmm", (), ()): 0.25, ("add", (), ()): 3.0,
                          ("_softmax", (), ()): 1.0})
    got = summary(timer, steps=2, flops=8e9)
    assert got["op_s"] == 4.0 and got["gemm_s"] == 2.0  # per step: 8 s and 4 s over 2 steps
    assert got["gemm_share"] == 0.5 and got["gemm_rate"] == 4e9
    assert got["ops"] == {"add": 1.5, "mm": 1.5, "_softmax": 0.5, "addmm": 0.25, "bmm": 0.125,
                          "baddbmm": 0.125}


def test_the_ops_counted_as_gemms_are_the_ops_with_flops_in_kilns_step():
    """torch's FLOP counter is the reference: an op of Kiln's training step (matmul attention,
    fused loss, bf16 autocast) with FLOPs that is not in GEMMS would leave its time out of
    the GEMM share, and a GEMMS name with none would put elementwise time in. The counter
    skips in-place forms (the matmul attention's backward accumulates dK and dV with
    `baddbmm_`, which GEMMS once missed: that time went to the non-GEMM ops), so an op named
    as a counted one plus a trailing underscore is a GEMM too."""
    from torch.utils.flop_counter import FlopCounterMode

    from kiln.config import ModelConfig
    from kiln.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=96, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                    max_seq_len=16))
    batch = torch.randint(0, 96, (2, 17))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch[:, :-1], targets=batch[:, 1:])
        loss.backward()

    timer, _ = profile_step(step, steps=1)
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    with_flops = {op.__name__ for op, n in counter.get_flop_counts()["Global"].items() if n}
    timed = {key[0] for key in timer.seconds}
    assert with_flops and with_flops <= timed
    in_place = {name for name in timed if name.endswith("_") and name[:-1] in with_flops}
    assert "baddbmm_" in in_place  # the attention backward's dK and dV products
    assert timed & GEMMS == with_flops | in_place


def test_the_benchmark_runs_end_to_end(capsys):
    """The script itself, not only its timer: it builds the trainer's step and prints its
    RESULT line (a changed Runner signature once broke it while these tests passed)."""
    from step_profile import main

    main(["--quick", "--steps", "1", "--precision", "fp32"])
    assert "RESULT" in capsys.readouterr().out
