"""LM head + cross-entropy in one pass, with the gradients computed during the forward.

The plain path (logits = h W^T, upcast, log-softmax, NLL, then the same in reverse) walks
the (tokens x vocab) logits about ten times and, under autocast, keeps them in memory
until backward. Here the logits are made a few hundred rows at a time into a buffer that
is reused, turned into the softmax-minus-one-hot gradient (an fp32 softmax in place, row
by row, minus the one-hot) and multiplied straight back into dL/dh and dL/dW; backward only
scales the stored gradients. The loss needs no log-softmax: with m the row's largest logit
the softmax's largest entry is exp(0) / S, so -log p_y = (m - z_y) - log(max_j p_j), exact
even where p_y itself underflows (a log-softmax and an exp pass cost 4.5 ms per 512 x 8192
chunk on the AVX-512 CPU, this 2.5 ms). The matmuls are the ones autocast runs (inputs in
the compute dtype, one rounding of each product), so the numbers match the plain path to
its own precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.model.layers import compute_dtype
from kiln.model.second_derivative import refuse_second_derivative

# fp32 elements of logits per chunk (16 MB: the softmax passes stay in cache-sized pieces)
CHUNK_ELEMENTS = 1 << 22
# bytes of the dL/dlogits buffer per group; dL/dh and dL/dW are one matmul per group
GROUP_BYTES = 64 << 20


def chunk_rows(vocab: int) -> int:
    return max(16, CHUNK_ELEMENTS // vocab)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, need_grad: bool, chunk: int):
        n, vocab = hidden.shape[0], weight.shape[0]
        dtype = hidden.dtype
        group = chunk
        if need_grad:  # the largest multiple of `chunk` rows whose gradient fits GROUP_BYTES
            group = max(chunk, GROUP_BYTES // (vocab * hidden.element_size()) // chunk * chunk)
        group = min(group, n)
        on_gpu = hidden.device.type == "cuda"
        if on_gpu:  # no cache to stay within: one softmax pass per group, far fewer launches
            chunk = group
        logits = torch.empty(group, vocab, dtype=dtype, device=hidden.device)
        rows = min(chunk, n)
        acc = torch.promote_types(dtype, torch.float32)  # the softmax dtype: fp64 stays fp64
        upcast = torch.empty(rows, vocab, dtype=acc, device=hidden.device) if dtype != acc else None
        minus_one = torch.full((rows, 1), -1.0, dtype=acc, device=hidden.device)
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = None
        wt = weight.t()
        # bf16 block.t() @ h runs at half speed on AMX (measured); making dW^T from two
        # contiguous operands and transposing the small (D x V) result back is faster.
        # fp32 matmuls run at one speed either way, so fp32 skips the transposes.
        transposed = dtype.itemsize < 4 and not on_gpu  # a CPU (AMX) workaround for bf16
        for g0 in range(0, n, group):
            g1 = min(g0 + group, n)
            block = logits[: g1 - g0]
            torch.mm(hidden[g0:g1], wt, out=block)  # one big matmul: chunked ones run slower
            for c0 in range(g0, g1, chunk):
                c1 = min(c0 + chunk, g1)
                part = block[c0 - g0 : c1 - g0]
                z = part if upcast is None else upcast[: c1 - c0].copy_(part)
                y = targets[c0:c1, None]
                loss += (z.amax(1) - z.gather(1, y)[:, 0]).sum()
                probs = torch.softmax(z, 1, out=z)  # row by row, in cache
                loss -= probs.amax(1).log_().sum()  # + log S (see the module docstring)
                if need_grad:  # softmax - onehot, in fp32, then once rounded to the matmul dtype
                    probs.scatter_add_(1, y, minus_one[: c1 - c0])
                    if probs is not part:
                        part.copy_(probs)
            if need_grad:
                torch.mm(block, weight, out=grad_hidden[g0:g1])
                if transposed:  # dW^T = h^T dlogits, both operands contiguous
                    partial = hidden[g0:g1].t().contiguous() @ block
                else:
                    partial = block.t() @ hidden[g0:g1]
                if grad_weight is None:
                    grad_weight = partial if g1 == n else partial.to(acc)
                else:
                    grad_weight.add_(partial)
        if transposed and grad_weight is not None:
            grad_weight = grad_weight.t().contiguous()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        refuse_second_derivative("the fused LM head + cross-entropy")
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is None:
            raise RuntimeError("linear_cross_entropy was called without gradients enabled")
        return (_scaled(grad_hidden, grad_loss, grad_hidden.dtype),
                _scaled(grad_weight, grad_loss, ctx.weight_dtype), None, None, None)


def _scaled(grad: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """grad x scale in the loss's dtype (fp32), rounded once to `dtype`; the saved `grad` is
    left as it is (a second backward reads it again). The upstream scale (1 / tokens, then
    / micro-batches) rounded to bf16 first was off by up to 2^-8, one factor for every
    parameter's gradient (+0.39% at 255 tokens); the plain path scales in fp32. (`grad` is
    bf16 already, so a small rounding bias stays: 0.17% on average at 255 tokens, 0.03% or
    less at the other sizes tried.) Under bf16 this costs one transient fp32 copy of dL/dh
    (tokens x dim), not of the logits."""
    wide = grad.to(scale.dtype)
    wide = wide.mul_(scale) if wide is not grad else wide * scale
    return wide.to(dtype)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int | None = None) -> torch.Tensor:
    """Sum over rows of cross_entropy(hidden @ weight.T, targets) as an fp32 scalar.

    hidden (N, D), weight (V, D), targets (N,) class indices. Under autocast the matmuls
    run in the autocast dtype (as `F.linear` would); the softmax is fp32 (fp64 inputs keep
    fp64 throughout, loss included). Memory:
    one (chunk x V) fp32 buffer and, when gradients are needed, up to GROUP_BYTES of
    dL/dlogits instead of the (N x V) logits. Under torch.compile: plain ops, full logits.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} "
                         "must be (N, D) and (V, D)")
    if hidden.shape[0] == 0:
        raise ValueError("linear_cross_entropy needs at least one row (got 0 tokens)")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be ({hidden.shape[0]},)")
    device = hidden.device.type
    dtype = compute_dtype(hidden)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    if torch.compiler.is_compiling():
        # Plain ops, which the compiler fuses itself. Compiled on CUDA (torch 2.11, H200),
        # the Function below gave all-zero gradients to every parameter while its loss was
        # right: `train.compile = true` did not learn. The logits then exist in full.
        acc = torch.promote_types(dtype, torch.float32)
        return F.cross_entropy(F.linear(hidden, weight).to(acc), targets.long(), reduction="sum")
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(device, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets.long(), need_grad,
                                         chunk or chunk_rows(weight.shape[0]))
