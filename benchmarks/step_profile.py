"""Where a training step's time goes, op by op: Kiln's step from throughput.py, timed per
ATen op.

A dispatch mode times every op the step runs, forward, backward and optimizer (on CPU
ops are synchronous, so each op's wall time is its cost). torch.profiler misled us on our
VMs: under it the fused head + loss took 342 ms a step, against 190 ms timed directly.
The mode's own cost (a few microseconds of Python per op) falls between the timed calls,
so the op total stays below the step's wall time; the difference is printed.

    python benchmarks/step_profile.py                  # the 21.9M model of throughput.py
    python benchmarks/step_profile.py --precision fp32 # default: what train.precision=auto picks
    python benchmarks/step_profile.py --quick --top 10
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_line, set_threads  # noqa: E402
from throughput import FULL, QUICK, Runner  # noqa: E402

from kiln.model import Transformer, flops_per_token  # noqa: E402
from kiln.train.host_memory import keep_freed_memory  # noqa: E402
from kiln.train.precision import cpu_has_fast_bf16  # noqa: E402

# the in-place forms too: the matmul attention's backward accumulates the key and value
# gradients with `baddbmm_`, a GEMM the op timer sees under its own name
GEMMS = {"mm", "bmm", "baddbmm", "addmm", "addbmm", "matmul", "linear",
         "baddbmm_", "addmm_", "addbmm_"}


class OpTimer(TorchDispatchMode):
    """Wall seconds and calls per (op, input shapes, input dtypes)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[tuple, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        elapsed = time.perf_counter() - start
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = (func.overloadpacket.__name__, tuple(tuple(t.shape) for t in tensors),
               tuple(str(t.dtype).removeprefix("torch.") for t in tensors))
        self.seconds[key] += elapsed
        self.calls[key] += 1
        return out

    def by_op(self) -> dict[str, float]:
        totals: dict[str, float] = collections.defaultdict(float)
        for (name, _, _), s in self.seconds.items():
            totals[name] += s
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def profile_step(step, steps: int) -> tuple[OpTimer, float]:
    """Run `step` `steps` times under the timer; returns it and the wall seconds per step."""
    timer = OpTimer()
    start = time.perf_counter()
    with timer:
        for _ in range(steps):
            step()
    return timer, (time.perf_counter() - start) / steps


def summary(timer: OpTimer, steps: int, flops: float) -> dict:
    """Per step: op seconds by op name, their total, the GEMMs' seconds, the GEMMs' share of
    the op time and their rate over `flops` (the step's counted FLOPs)."""
    ops = {k: v / steps for k, v in timer.by_op().items()}
    total = sum(ops.values())
    gemm = sum(v for k, v in ops.items() if k in GEMMS)
    return {"ops": ops, "op_s": total, "gemm_s": gemm, "gemm_share": gemm / total,
            "gemm_rate": flops / gemm}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                        help="default: bf16 where the CPU runs it natively, else fp32")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warmup)")
    parser.add_argument("--top", type=int, default=25, help="rows of the per-shape table")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    precision = args.precision or ("bf16" if cpu_has_fast_bf16() else "fp32")
    threads = set_threads()
    keep_freed_memory()
    torch.manual_seed(0)
    model = Transformer(s.model)
    runner = Runner("kiln", model, lambda x, y: model(x, targets=y), precision, False,
                    torch.device("cpu"))
    batch = torch.randint(0, s.model.vocab_size, (s.batch, s.seq_len + 1))
    for _ in range(3):
        runner.step(batch)
    timer, wall = profile_step(lambda: runner.step(batch), args.steps)

    n = args.steps
    figures = summary(timer, n, flops_per_token(s.model, s.seq_len) * s.batch * s.seq_len)
    ops, total, gemm, gemm_rate = (figures[k] for k in ("ops", "op_s", "gemm_s", "gemm_rate"))
    print(f"{precision}, {threads} threads, batch {s.batch} x {s.seq_len}: {wall * 1e3:.0f} ms "
          f"a step under the timer, of which ops {total * 1e3:.0f} ms (the rest is Python "
          f"and the timer); GEMMs {gemm * 1e3:.0f} ms ({100 * gemm / total:.0f}% of op time, "
          f"{gemm_rate / 1e9:.0f} GFLOP/s over the counted FLOPs)")
    print("per op (ms a step): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in list(ops.items())[:20]))
    print(f"\n{'ms/step':>8} {'calls':>6}  op, input shapes, dtypes")
    for key, sec in sorted(timer.seconds.items(), key=lambda kv: -kv[1])[: args.top]:
        name, shapes, dtypes = key
        print(f"{sec / n * 1e3:8.2f} {timer.calls[key] // n:6d}  {name} {list(shapes)} {list(dtypes)}")
    print(result_line(step_ms=wall * 1e3, op_ms=total * 1e3, gemm_ms=gemm * 1e3,
                      gemm_share=gemm / total, bf16=int(precision == "bf16")))


if __name__ == "__main__":
    main()
