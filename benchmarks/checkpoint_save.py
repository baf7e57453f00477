"""A checkpoint-like save (fp32 weights in safetensors, AdamW's two moments through
torch.save, ~500 MB in all) with its sha256s, as Kiln's checkpoints take them (torch.save's
files hashed as written through `kiln.hashing.HashingWriter`; safetensors, which has no such
hook, read back) against the earlier write-then-read-back of every file.

    python benchmarks/checkpoint_save.py [--mb 500] [--repeats 5] [--dir DIR]

Each save runs in its own process, so its peak memory (VmHWM) above what the tensors
themselves take is its own; the variants alternate, round by round, on a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import median, peak_rss_mb, result_line

VARIANTS = ("read_back", "hashed")


def _tensors(mb: int) -> tuple[dict, dict]:
    import torch

    n = mb * 2**20 // 12 // 4096  # weights + two moments of 4096-wide fp32 rows
    weights = {f"layers.{i}.w": torch.randn(n // 8, 4096) for i in range(8)}
    moments = {"state": {i: {"exp_avg": torch.randn_like(w), "exp_avg_sq": torch.rand_like(w),
                             "step": torch.tensor(1.0)}
                         for i, w in enumerate(weights.values())}}
    return weights, moments


def _savers() -> tuple:
    """Kiln's save and hash functions, imported before anything is measured: their imports
    (torch, the trainer's modules: ~50 MB and ~0.5 s) are not part of a save."""
    import torch

    from kiln.hashing import file_sha256
    from kiln.tensor_files import save_tensors
    from kiln.train.checkpoint import _save_hashed

    return torch.save, file_sha256, save_tensors, _save_hashed


def _save(variant: str, weights: dict, moments: dict, out: Path) -> dict[str, str]:
    torch_save, file_sha256, save_tensors, save_hashed = _savers()
    save_tensors(weights, out / "model.safetensors")
    sums = {"model.safetensors": file_sha256(out / "model.safetensors")}
    if variant == "read_back":  # before: write, then read the file again to hash it
        torch_save(moments, out / "optimizer.pt")
        return {**sums, "optimizer.pt": file_sha256(out / "optimizer.pt")}
    return {**sums, "optimizer.pt": save_hashed(moments, out / "optimizer.pt")}


def child(variant: str, mb: int, where: str) -> None:
    import torch

    _savers()  # every import done before the baseline
    torch.manual_seed(0)
    weights, moments = _tensors(mb)
    before = peak_rss_mb()
    out = Path(tempfile.mkdtemp(dir=where))
    try:
        start, cpu = time.perf_counter(), time.process_time()
        sums = _save(variant, weights, moments, out)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        size = sum(p.stat().st_size for p in out.iterdir())
        file_sha256 = _savers()[1]
        assert sums == {n: file_sha256(out / n) for n in sums}, variant
    finally:
        shutil.rmtree(out)
    extra = peak_rss_mb() - before
    print(json.dumps({"s": seconds, "cpu_s": cpu, "extra_mb": extra, "file_mb": size / 2**20}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--child", choices=VARIANTS)
    a = p.parse_args()
    if a.child:
        return child(a.child, a.mb, a.dir)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(a.repeats):  # A B, then B A: drift hits both alike
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            line = subprocess.run([sys.executable, __file__, "--child", v, "--mb", str(a.mb),
                                   "--dir", a.dir], env=env, check=True, capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1]
            runs[v].append(json.loads(line))
    print(f"{'variant':<10} {'file MB':>8} {'median s':>9} {'all s':<36} {'median CPU s':>12} "
          f"{'peak MB over tensors':>20}")
    for v, rs in runs.items():
        each = " ".join(f"{r['s']:.2f}" for r in rs)
        print(f"{v:<10} {rs[0]['file_mb']:8.0f} {median([r['s'] for r in rs]):9.2f} {each:<36} "
              f"{median([r['cpu_s'] for r in rs]):12.2f} "
              f"{max(r['extra_mb'] for r in rs):20.0f}")
    s = {v: median([r["s"] for r in rs]) for v, rs in runs.items()}
    print(result_line(read_back_s=s["read_back"], hashed_s=s["hashed"],
                      hashed_over_read_back=s["hashed"] / s["read_back"],
                      read_back_cpu_s=median([r["cpu_s"] for r in runs["read_back"]]),
                      hashed_cpu_s=median([r["cpu_s"] for r in runs["hashed"]]),
                      hashed_extra_mb=max(r["extra_mb"] for r in runs["hashed"]),
                      read_back_extra_mb=max(r["extra_mb"] for r in runs["read_back"])))


if __name__ == "__main__":
    main()
