"""Causal grouped-query attention as batched matmuls, for training on CPU.

PyTorch's CPU flash-attention backward runs at the same speed in bf16 as in fp32 (it
does not use the AMX / AVX-512 BF16 units) and takes ~9x its forward: 40 ms of a
(16 x 8 heads x 256 x 64) layer's 44 ms, a quarter of the whole training step. Written
as batched bf16 matmuls around PyTorch's fused softmax and softmax-backward kernels, the
same layer takes 22 ms. Computed a block of `BLOCK` query positions at a time against
only the keys the block can see (causal, and inside the window for sliding-window
layers), it skips most of the hidden part of the T x T square: 5/8 of the products
remain at T = 256, and the layer takes ~20 ms (the attention of a 6-layer step: ~125 ms
-> ~95 ms). In fp32 the blocks take 41-49 ms against SDPA's 58-61 ms (the whole fp32
step ~5% faster). With document ids (`kiln.model.doc_mask`) a block also starts, in each
batch row, after the keys of earlier documents that none of the row's queries sees: rows
are taken in contiguous runs, each one batched matmul from its rows' earliest start
(`_row_runs`; in bf16 one run of all rows, where more did not pay: `RUN_COST`).

In bf16 the numerics are those of plain ("eager") attention under autocast: scores and
probabilities rounded to bf16, softmax in fp32 inside the kernel, key and value
gradients summed over the blocks in bf16 (one rounding per block); errors against an
fp64 reference are of the same size as SDPA's (tests/test_matmul_attention.py, with 64-
and 5-position blocks). The probabilities are kept for backward, so `uses_matmul_path`
picks this path only while they stay small; otherwise, and without gradients, attention
goes through SDPA.

Heads that share a key/value head are stacked along the query rows, position-major
(B*KV, T*rep, D): a block of positions is a contiguous run of rows, GQA needs no copies
of k and v, and their gradients come out already summed.
"""

from __future__ import annotations

import math

import torch

from kiln.model.second_derivative import refuse_second_derivative

# largest kept probabilities per layer (bytes) for the matmul path. Forward + backward
# per layer (8 heads / 4 kv, d 64), blocks against SDPA: bf16 4 x 1024 63 vs 129 ms (36 MB
# kept), 2 x 2048 104 vs 211 ms (69 MB); fp32 16 x 512 164 vs 231 ms (75 MB), 1 x 2048
# 132 vs 135 ms (69 MB), but 2 x 2048 351 vs 270 ms (138 MB): past ~128 MB SDPA wins
MAX_PROBS_BYTES = 128 << 20
# query positions per block: smaller blocks skip more of the hidden square but run
# smaller, slower matmuls (at T = 256, D = 64 in bf16, blocks of 32, 64 and 128 timed
# alike, 15-20% under the unblocked square; 64 skips 3/8 of it)
BLOCK = 64


def _hidden_keys(t: int, window: int, device: torch.device) -> torch.Tensor:
    """(t, t) mask of the keys query i may not see: the future, and with a window, keys
    `window` or more positions back."""
    hidden = torch.ones(t, t, dtype=torch.bool, device=device).triu_(1)
    if window:
        hidden |= torch.ones(t, t, dtype=torch.bool, device=device).tril_(-window)
    return hidden


def _blocks(t: int, window: int) -> list[tuple[int, int, int]]:
    """(first query, end query, first visible key) per block; keys end where queries do."""
    return [(start, min(t, start + BLOCK), max(0, start - window + 1) if window else 0)
            for start in range(0, t, BLOCK)]


class _MatmulAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, window: int, doc_ids: torch.Tensor | None):
        b, h, t, d = q.shape
        kv = k.shape[1]
        rep = h // kv
        scale = 1.0 / math.sqrt(d)
        # rows of head group g: (position, head in group), the scale folded into the copy
        grouped = q.reshape(b, kv, rep, t, d).permute(0, 1, 3, 2, 4)
        if torch.compiler.is_compiling():  # the compiler restrides `out=` (then views fail)
            qs = (grouped * scale).reshape(b * kv, t * rep, d)
        else:
            qs = torch.empty(b, kv, t, rep, d, dtype=q.dtype, device=q.device)
            qs = torch.mul(grouped, scale, out=qs).view(b * kv, t * rep, d)
        kg, vg = k.reshape(b * kv, t, d), v.reshape(b * kv, t, d)
        hidden = _hidden_keys(t, window, q.device)
        out = torch.empty(b, t, kv, rep, d, dtype=q.dtype, device=q.device)  # (B, T, H, D)
        blocks, probs = [], []
        for start, stop, lo in _blocks(t, window):
            cols = slice(start * rep, stop * rep)
            if doc_ids is None:
                bias = torch.zeros(stop - start, stop - lo, dtype=q.dtype, device=q.device)
                bias.masked_fill_(hidden[start:stop, lo:stop], float("-inf"))
                scores = torch.baddbmm(bias.repeat_interleave(rep, dim=0), qs[:, cols],
                                       kg[:, lo:stop].transpose(1, 2))
                runs = [(0, b, lo, scores)]
            else:  # each run of batch rows from its own first key, one batched matmul
                hide = _hidden_from_documents(doc_ids, hidden, start, stop, lo)
                runs = []
                per_key = kv * rep * (stop - start) * d
                for r0, r1, first in _row_runs(hide, lo, stop, per_key, q.dtype):
                    rows = slice(r0 * kv, r1 * kv)
                    scores = torch.bmm(qs[rows, cols], kg[rows, first:stop].transpose(1, 2))
                    scores.view(r1 - r0, kv, stop - start, rep, stop - first).masked_fill_(
                        hide[r0:r1, None, :, None, first - lo:], float("-inf"))
                    runs.append((r0, r1, first, scores))
            for r0, r1, first, scores in runs:
                p = torch.softmax(scores, dim=-1)
                block_out = torch.bmm(p, vg[r0 * kv : r1 * kv, first:stop])
                out[r0:r1, start:stop] = block_out.view(r1 - r0, kv, stop - start, rep, d).permute(
                    0, 2, 1, 3, 4)
                blocks.append((start, stop, r0, r1, first))
                probs.append(p)
        ctx.save_for_backward(qs, kg, vg, *probs)
        ctx.scale, ctx.blocks = scale, blocks
        # (B, H, T, D) over (B, T, H, D) memory: the caller's transpose back is free
        return out.view(b, t, h, d).transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        refuse_second_derivative("matmul attention (model.attn_kernel)")
        qs, kg, vg, *probs = ctx.saved_tensors
        b, h, t, d = grad_out.shape
        kv = kg.shape[0] // b
        rep = h // kv
        go = grad_out.reshape(b, kv, rep, t, d).permute(0, 1, 3, 2, 4).reshape(b * kv, t * rep, d)
        grad_q = torch.empty(b, t, kv, rep, d, dtype=qs.dtype, device=qs.device)
        grad_k, grad_v = torch.zeros_like(kg), torch.zeros_like(vg)
        for (start, stop, r0, r1, lo), p in zip(ctx.blocks, probs):
            rows, cols = slice(r0 * kv, r1 * kv), slice(start * rep, stop * rep)
            g = go[rows, cols]
            grad_v[rows, lo:stop].baddbmm_(p.transpose(1, 2), g)
            grad_p = torch.bmm(g, vg[rows, lo:stop].transpose(1, 2))
            grad_s = torch._softmax_backward_data(grad_p, p, -1, p.dtype)
            block_q = torch.bmm(grad_s, kg[rows, lo:stop]).mul_(ctx.scale)
            grad_q[r0:r1, start:stop] = block_q.view(r1 - r0, kv, stop - start, rep, d).permute(
                0, 2, 1, 3, 4)
            grad_k[rows, lo:stop].baddbmm_(grad_s.transpose(1, 2), qs[rows, cols])
        return (grad_q.view(b, t, h, d).transpose(1, 2), grad_k.view(b, kv, t, d),
                grad_v.view(b, kv, t, d), None, None)


def _hidden_from_documents(doc_ids: torch.Tensor, hidden: torch.Tensor, start: int, stop: int,
                           lo: int) -> torch.Tensor:
    """(B, stop - start, stop - lo) keys hidden from the block's queries, per batch row: the
    shared causal / window mask, and keys of another document than the query's. Their
    scores are set to -inf (one pass, broadcast over the heads), so their probabilities
    come out 0 and backward needs no mask of its own."""
    return (doc_ids[:, start:stop, None] != doc_ids[:, None, lo:stop]) | hidden[start:stop, lo:stop]


def _leading_hidden_keys(hide: torch.Tensor) -> list[int]:
    """Per batch row, how many of the block's first keys none of the row's queries sees (the
    keys of the documents before the one holding its first query): 0 up to the whole block's
    keys but its own (a query sees itself)."""
    # per (row, key), 1 if hidden from every query; the first 0 (argmin takes the first of
    # ties). As uint8 this is a few us a block, where bool all() took ~130 us
    return hide.view(torch.uint8).amin(dim=1).argmin(dim=1).tolist()


# what one more run of batch rows costs (its dozen kernel calls, forward and backward), in
# multiply-adds of one of the block's products, by dtype. At B 16, T 256, 8 / 4 heads of
# 64, 2 threads, fp32 ran fastest at 2-4e6 (the kernel's forward + backward 15-23% faster
# than with one range for all rows, documents of random lengths); bf16 products run ~2x
# faster (AMX), so the runs' own cost weighs more, and no value was measurably faster
# there (4e6-6.4e7: 9% slower to 3% faster, benchmarks/README.md): bf16 takes one run
RUN_COST: dict[torch.dtype, float] = {torch.float32: 4e6, torch.bfloat16: math.inf}
# the most cut points `_row_runs`'s dynamic program weighs: its B^2 / 2 Python steps took
# ~1.3 ms a block at B 128 (5-9% of the kernel's forward + backward with heads of 16-32),
# so past this many rows adjacent rows are grouped and a run starts and ends at a group's
# edge (B 128: groups of 4; ~0.1 ms). Up to it every row is its own group, as before
MAX_RUN_GROUPS = 32


def _row_runs(hide: torch.Tensor, lo: int, stop: int, per_key: int,
              dtype: torch.dtype = torch.float32) -> list[tuple[int, int, int]]:
    """The block's batch rows in contiguous runs (first row, end row, first key), a run's keys
    starting at the earliest of its rows' first keys seen (`_leading_hidden_keys`).

    Rows whose documents start at different places need different key ranges; a run is one
    batched matmul over slices of the inputs (no copies), so the split trades the keys
    computed (`per_key` multiply-adds each per row) against RUN_COST per run (at `dtype`):
    the least total, by dynamic programming over where runs end (G^2 / 2 steps for G groups
    of adjacent rows, at most MAX_RUN_GROUPS; ties: fewer, longer runs). Skipped keys get
    probability exactly 0, so the result is the un-narrowed one but for the order of float
    sums. It depends on the data, so under torch.compile (which would have to guard on it)
    all rows take one run from `lo`: nothing is skipped."""
    n = hide.shape[0]
    if torch.compiler.is_compiling():
        return [(0, n, lo)]
    firsts = [lo + skip for skip in _leading_hidden_keys(hide)]
    overhead = RUN_COST.get(dtype, RUN_COST[torch.float32]) / per_key  # keys of one row
    if overhead == math.inf:  # one run (bf16)
        return [(0, n, min(firsts))]
    size = -(-n // MAX_RUN_GROUPS)  # rows per group
    edges = [*range(0, n, size), n]
    groups = len(edges) - 1
    group_first = [min(firsts[a:z]) for a, z in zip(edges, edges[1:])]
    best, cut = [0.0] + [math.inf] * groups, [0] * (groups + 1)
    for end in range(1, groups + 1):  # best[end]: groups [0, end) split at their cheapest
        first = stop
        for g0 in range(end - 1, -1, -1):
            first = min(first, group_first[g0])
            cost = best[g0] + overhead + (edges[end] - edges[g0]) * (stop - first)
            if cost <= best[end]:
                best[end], cut[end] = cost, g0
    runs, end = [], groups
    while end:
        g0 = cut[end]
        runs.append((edges[g0], edges[end], min(group_first[g0:end])))
        end = g0
    return runs[::-1]


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int = 0, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, KV, T, D), H a multiple of KV;
    with `window` > 0, query i sees keys i - window < j <= i (sliding-window layers); with
    `doc_ids` (B, T), only keys of the query's own document (`kiln.model.doc_mask`)."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    if doc_ids is not None and doc_ids.dim() == 2 and doc_ids.shape[0] == 1:
        doc_ids = doc_ids.expand(q.shape[0], -1)  # the skip is worked out per row of doc_ids
    if doc_ids is not None and tuple(doc_ids.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(f"doc_ids of shape {tuple(doc_ids.shape)} for queries of batch "
                         f"{q.shape[0]} and length {q.shape[2]}: give one row per batch row")
    return _MatmulAttention.apply(q, k, v, window, doc_ids)


def uses_matmul_path(q: torch.Tensor, kernel: str, window: int = 0) -> bool:
    """Whether attention over these queries takes the matmul path. kernel: 'auto' (bf16
    or fp32 training on CPU while the probabilities fit MAX_PROBS_BYTES), 'sdpa' or
    'matmul'."""
    if kernel == "sdpa":
        return False
    if kernel == "matmul":
        return True
    b, h, t, _ = q.shape
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float32)
            and torch.is_grad_enabled() and q.requires_grad
            and b * h * kept_probs(t, window) * q.element_size() <= MAX_PROBS_BYTES)


def kept_probs(t: int, window: int = 0) -> int:
    """Probabilities per head the matmul path keeps for backward: the visible blocks. With
    document ids the blocks may start later (data-dependent): this is their upper bound."""
    return sum((stop - start) * (stop - lo) for start, stop, lo in _blocks(t, window))

