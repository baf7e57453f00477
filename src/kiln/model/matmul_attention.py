"""Causal grouped-query attention as batched matmuls, for bf16 training on CPU.

PyTorch's CPU flash-attention backward runs at the same speed in bf16 as in fp32 (it
does not use the AMX / AVX-512 BF16 units) and takes ~9x its forward: 40 ms of a
(16 x 8 heads x 256 x 64) layer's 44 ms, a quarter of the whole training step. Written
as five batched bf16 matmuls around PyTorch's fused softmax and softmax-backward
kernels, the same layer takes 22 ms. The numerics are those of plain ("eager")
attention under autocast: scores and probabilities rounded to bf16, softmax in fp32
inside the kernel; errors against an fp64 reference are of the same size as SDPA's
(tests/test_matmul_attention.py). The probabilities (B x H x T x T, bf16) are kept for
backward, so `uses_matmul_path` picks this path only while they stay small; otherwise,
for fp32, and without gradients, attention goes through SDPA. Sliding-window layers use
the same kernel with a banded mask.

Heads that share a key/value head are stacked along the query rows, (B*KV, rep*T, D),
so GQA needs no copies of k and v and their gradients come out already summed.
"""

from __future__ import annotations

import math

import torch

# largest kept probabilities per layer (bytes) for the matmul path
MAX_PROBS_BYTES = 64 << 20


def _hidden_keys(t: int, window: int, device: torch.device) -> torch.Tensor:
    """(t, t) mask of the keys query i may not see: the future, and with a window, keys
    `window` or more positions back."""
    hidden = torch.ones(t, t, dtype=torch.bool, device=device).triu_(1)
    if window:
        hidden |= torch.ones(t, t, dtype=torch.bool, device=device).tril_(-window)
    return hidden


class _MatmulAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, window: int):
        b, h, t, d = q.shape
        kv = k.shape[1]
        rep = h // kv
        scale = 1.0 / math.sqrt(d)
        qs = (q * scale).reshape(b * kv, rep * t, d)
        kg, vg = k.reshape(b * kv, t, d), v.reshape(b * kv, t, d)
        hidden = _hidden_keys(t, window, q.device)
        bias = torch.zeros(t, t, dtype=q.dtype, device=q.device).masked_fill_(hidden, float("-inf"))
        scores = torch.baddbmm(bias.repeat(rep, 1), qs, kg.transpose(1, 2))
        probs = torch.softmax(scores, dim=-1)
        out = torch.bmm(probs, vg)
        ctx.save_for_backward(qs, kg, vg, probs)
        ctx.scale = scale
        return out.view(b, h, t, d)

    @staticmethod
    def backward(ctx, grad_out):
        qs, kg, vg, probs = ctx.saved_tensors
        b, h, t, d = grad_out.shape
        kv = kg.shape[0] // b
        go = grad_out.reshape(b * kv, (h // kv) * t, d)
        grad_v = torch.bmm(probs.transpose(1, 2), go)
        grad_probs = torch.bmm(go, vg.transpose(1, 2))
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_q = torch.bmm(grad_scores, kg).mul_(ctx.scale)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), qs)
        return (grad_q.view(b, h, t, d), grad_k.view(b, kv, t, d), grad_v.view(b, kv, t, d),
                None)


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int = 0) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, KV, T, D), H a multiple of KV;
    with `window` > 0, query i sees keys i - window < j <= i (sliding-window layers)."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    return _MatmulAttention.apply(q, k, v, window)


def uses_matmul_path(q: torch.Tensor, kernel: str) -> bool:
    """Whether attention over these queries takes the matmul path. kernel: 'auto' (bf16
    training on CPU while the probabilities fit MAX_PROBS_BYTES), 'sdpa' or 'matmul'."""
    if kernel == "sdpa":
        return False
    if kernel == "matmul":
        return True
    b, h, t, _ = q.shape
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled()
            and q.requires_grad and b * h * t * t * q.element_size() <= MAX_PROBS_BYTES)

