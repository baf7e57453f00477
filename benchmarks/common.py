"""Helpers shared by the benchmarks: threads, timing, matmul peak, GPU datasheet peaks,
the RESULT line."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def set_threads() -> int:
    """Use every core the process may run on; returns the thread count (printed by callers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def time_call(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes (synchronising CUDA if that is where work runs)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median seconds of `repeats` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return median([time_call(fn) for _ in range(repeats)])


def matmul_flops(dtype: torch.dtype, n: int, repeats: int, device: str = "cpu") -> float:
    """Median FLOP/s of an n x n x n `torch.matmul` with inputs already in `dtype`."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / median_time(lambda: torch.matmul(a, b), repeats, warmup=2)


# Datasheet dense (no sparsity) tensor-core FLOP/s by precision, matched against
# torch.cuda.get_device_name(); the first match wins, so the PCIe and NVL variants (names
# that also hold "H100" / "H200") come before the SXM parts. H200 and GH200 have the H100
# SXM's compute.
SPEC_PEAKS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "fp32": 60e12}),
    ("H200 NVL", {"bf16": 835e12, "fp32": 60e12}),
    ("H100", {"bf16": 989e12, "fp32": 67e12}),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", {"bf16": 989e12, "fp32": 67e12}),  # also "NVIDIA GH200 480GB"
    ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
]


def chip_peak(name: str, precision: str) -> float | None:
    """The datasheet dense peak of the GPU named `name` (torch.cuda.get_device_name) at
    `precision`, or None for a chip the table does not know."""
    return next((peaks.get(precision) for key, peaks in SPEC_PEAKS if key in name), None)


def peak_rss_mb() -> float:
    """This process's peak resident memory, MB: Linux's VmHWM, which starts afresh at exec.
    ru_maxrss does not: a child starts at its parent's peak (run from a 600 MB pytest, a
    save's child read 600 MB before it allocated anything, and its extra memory as 0)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:  # not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# the models of the host-memory benchmarks (build_memory.py, load_memory.py): "full" 512 MB
# of fp32 weights, "quick" (--quick) ~40 MB; untied, so the head is a weight of its own
MEMORY_SHAPES = {
    "full": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12,
                 max_seq_len=1024, tie_embeddings=False),
    "quick": dict(vocab_size=8000, dim=256, n_layers=8, n_heads=4, n_kv_heads=4,
                  max_seq_len=256, tie_embeddings=False)}


def result_line(**figures: float) -> str:
    """`RESULT name=value ...` with plain numbers, the last line every benchmark prints."""
    def fmt(v: float) -> str:
        if isinstance(v, int):  # a bool too: 1 or 0, a number as the line promises
            return str(int(v))
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.4g}"

    return "RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in figures.items())
