"""Forward+backward throughput of the MoE layer against a dense SwiGLU of equal active size.

The dense peer has hidden = top_k * expert_hidden + n_shared * expert_hidden, so both do
the same matmul FLOPs per token; the ratio measures what routing, sorting, gathering and
scattering cost on top. Both expert backends (grouped_mm, padded bmm) are timed; the
headline ratio is for the layer's default ("auto") backend. Calls are interleaved in
rounds (each round runs every contender once, in rotating order) and tokens/s are medians.

    python benchmarks/moe_layer.py            # dim 256, 16 experts x 128, top-2, 4096 tokens
    python benchmarks/moe_layer.py --quick    # smoke test
    python benchmarks/moe_layer.py --bf16     # under bf16 autocast
    python benchmarks/moe_layer.py --threads 1  # steadier on a machine shared with others
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, result_line, set_threads, time_call  # noqa: E402

from kiln.model.layers import SwiGLU  # noqa: E402
from kiln.model.moe import MoE  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="run under bf16 autocast")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: every core)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    threads = set_threads()
    if a.threads > 0:
        torch.set_num_threads(threads := a.threads)
    dim, hidden, experts, top_k, shared = 256, 128, 16, 2, 1
    batch, seq, rounds = (2, 256, 5) if a.quick else (8, 512, 21)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    moe_args = dict(dim=dim, expert_hidden=hidden, n_experts=experts, top_k=top_k,
                    n_shared=shared, balance="smebu")
    contenders = {
        "moe": MoE(**moe_args, backend="auto").to(dev),
        "moe_grouped_mm": MoE(**moe_args, backend="grouped_mm").to(dev),
        "moe_padded_bmm": MoE(**moe_args, backend="padded_bmm").to(dev),
        "dense": SwiGLU(dim, (top_k + shared) * hidden).to(dev),
    }
    x = torch.randn(batch, seq, dim, device=dev)
    grad = torch.randn_like(x)
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext())

    def step(layer):
        def run():
            with amp:
                y = layer(x)
            y.backward(grad)
            layer.zero_grad(set_to_none=True)
        return run

    runs = {name: step(layer) for name, layer in contenders.items()}
    for run in runs.values():  # warm-up (and the grouped_mm probe)
        run()
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(time_call(runs[name]))
    tokens = batch * seq
    tps = {name: tokens / median(t) for name, t in times.items()}
    backend = contenders["moe"].experts.resolved_backend(x.to(torch.bfloat16 if a.bf16 else x.dtype))
    print(f"device={dev} threads={threads} tokens={tokens} dim={dim} experts={experts}x{hidden} "
          f"top_k={top_k} shared={shared} dense_hidden={(top_k + shared) * hidden} "
          f"bf16={a.bf16} auto_backend={backend}")
    for name, v in tps.items():
        print(f"  {name:16s} {v:12.0f} tokens/s  (median of {rounds})")
    print(result_line(
        moe_over_dense_tokens_per_s=tps["moe"] / tps["dense"],
        grouped_mm_over_dense=tps["moe_grouped_mm"] / tps["dense"],
        padded_bmm_over_dense=tps["moe_padded_bmm"] / tps["dense"],
        moe_tokens_per_s=tps["moe"], dense_tokens_per_s=tps["dense"],
    ))


if __name__ == "__main__":
    main()
