"""The GEMM floor of a dense training step: its matrix multiplies alone, each at its best.

A training step's counted FLOPs (`flops_per_token`) are all matrix multiplies: per layer
the q/k/v/o and gate/up/down projections and the T x T attention products, then the
output head; each forward GEMM has two backward GEMMs (input and weight gradient). This
module times every one of them on its own, at the step's shapes and dtype, in each
operand layout that can compute it (plain, transposed views as autograd passes them,
and the fused q|k|v and gate|up weights), and sums the fastest. Nothing else — norms,
activations, softmax, the loss, the optimizer, casts, copies — is counted.

The sum is a lower bound on the step time of any implementation that runs those FLOPs
through torch's GEMM library at that precision: `flops / floor / peak` is the highest
`peak_fraction` reachable, and `hf step / floor` the highest speedup over a reference
that takes the given time. Isolated GEMMs also run with warm caches, so the bound is
optimistic (the true floor is higher). An implementation that skips the hidden part of
the causal square runs fewer FLOPs than counted here: Kiln's blocked matmul attention
computes 5/8 of the attention products at T = 256, so for it the floor's attention part
(~10% of the floor in bf16 at the benchmark's shapes) is ~3/8 too high.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from common import median_time

from kiln.config import ModelConfig
from kiln.model import ffn_hidden_size
from kiln.model.transformer import head_dim


@dataclasses.dataclass
class Floor:
    seconds: float  # sum of the fastest time of every GEMM in one step
    flops: float  # FLOPs of the GEMMs timed (equals flops_per_token x tokens for dense global attention)
    parts: dict[str, float]  # seconds per part: attention, projections, mlp, head
    best_rate: float  # FLOP/s of the fastest single GEMM (a peak the square matmul may miss)
    best_call: Callable[[], object]  # that GEMM, ready to time again
    best_flops: float  # FLOPs of one best_call


_rates: list[tuple[float, Callable[[], object], float]] = []  # (FLOP/s, call, FLOPs) per GEMM


Timed = tuple[float, float]  # (seconds, FLOPs) of GEMMs timed


def _add(*parts: Timed) -> Timed:
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _best_time(candidates: list, repeats: int, inner: int) -> Timed:
    """Fastest median over candidate zero-argument calls computing the same product, whose
    inner (contracted) dimension is `inner`, with its FLOPs; records the fastest in `_rates`."""
    best, best_fn = float("inf"), candidates[0]
    for fn in candidates:
        seconds = median_time(fn, repeats)
        if seconds < best:
            best, best_fn = seconds, fn
    flops = 2 * best_fn().numel() * inner
    _rates.append((flops / best, best_fn, flops))
    return best, flops


def _linear_times(m: int, k: int, outs: list[int], dtype: torch.dtype, repeats: int,
                  device: torch.device) -> Timed:
    """Forward + input-gradient + weight-gradient GEMMs of linears sharing input [m, k] with
    output widths `outs`; the faster of separate and fused weights."""
    x = torch.randn(m, k, device=device).to(dtype)

    def gemms(n: int) -> Timed:
        w = torch.randn(n, k, device=device).to(dtype)  # nn.Linear weight [out, in]
        dy = torch.randn(m, n, device=device).to(dtype)
        dy_t = dy.t().contiguous()
        x_t = x.t().contiguous()
        fwd = _best_time([lambda: torch.nn.functional.linear(x, w), lambda: x @ w.t()], repeats, k)
        dx = _best_time([lambda: dy @ w], repeats, n)
        dw = _best_time([lambda: dy.t() @ x, lambda: dy_t @ x, lambda: x_t @ dy], repeats, m)
        return _add(fwd, dx, dw)

    separate = _add(*(gemms(n) for n in outs))
    return min(separate, gemms(sum(outs))) if len(outs) > 1 else separate  # the same FLOPs


def _attention_times(batch: int, heads: int, t: int, hd: int, dtype: torch.dtype,
                     repeats: int, device: torch.device) -> Timed:
    """QK^T and PV forward, and their four backward products, over the full T x T square
    (the square `flops_per_token` counts), batched over batch x heads."""
    bh = batch * heads
    q, k, v, do = (torch.randn(bh, t, hd, device=device).to(dtype) for _ in range(4))
    p = torch.randn(bh, t, t, device=device).to(dtype)
    kt = k.transpose(1, 2).contiguous()
    return _add(*(_best_time(c, repeats, inner) for c, inner in (
        ([lambda: q @ k.transpose(1, 2), lambda: q @ kt], hd),  # S = Q K^T
        ([lambda: p @ v], t),  # O = P V
        ([lambda: do @ v.transpose(1, 2)], hd),  # dP = dO V^T
        ([lambda: p.transpose(1, 2) @ do], t),  # dV = P^T dO
        ([lambda: p @ k], t),  # dQ = dS K
        ([lambda: p.transpose(1, 2) @ q], t),  # dK = dS^T Q
    )))


def gemm_floor(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype,
               repeats: int = 3, device: torch.device | str = "cpu") -> Floor:
    """Time the GEMMs of one forward + backward of a dense decoder (global attention)."""
    device = torch.device(device)
    if cfg.n_experts or cfg.local_per_global or cfg.attn_gate:
        raise ValueError("gemm_floor models dense decoders with global attention and no "
                         "attention gate only")
    _rates.clear()
    # the head width as the model builds it (`head_dim` may set it apart from dim // n_heads)
    m, d, hd = batch * seq_len, cfg.dim, head_dim(cfg)
    f, kv = ffn_hidden_size(cfg), cfg.n_kv_heads * hd
    with torch.no_grad():
        proj = _add(_linear_times(m, d, [cfg.n_heads * hd, kv, kv], dtype, repeats, device),
                    _linear_times(m, cfg.n_heads * hd, [d], dtype, repeats, device))
        mlp = _add(_linear_times(m, d, [f, f], dtype, repeats, device),
                   _linear_times(m, f, [d], dtype, repeats, device))
        attn = _attention_times(batch, cfg.n_heads, seq_len, hd, dtype, repeats, device)
        head = _linear_times(m, d, [cfg.vocab_size], dtype, repeats, device)
    per_layer = {"attention": attn, "projections": proj, "mlp": mlp}
    parts = {name: cfg.n_layers * s for name, (s, _) in per_layer.items()} | {"head": head[0]}
    flops = cfg.n_layers * sum(f for _, f in per_layer.values()) + head[1]
    rate, call, call_flops = max(_rates, key=lambda r: r[0])
    _rates.clear()  # the other GEMMs' operands (hundreds of MB) need not outlive the call
    return Floor(seconds=sum(parts.values()), flops=flops, parts=parts, best_rate=rate,
                 best_call=call, best_flops=call_flops)
