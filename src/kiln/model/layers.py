"""Building blocks of the decoder: RMSNorm, rotary embeddings, GQA attention, SwiGLU.

Conventions follow Llama (rotate-half RoPE, fp32 norm statistics) so that an exported
model is a drop-in `LlamaForCausalLM` without permuting weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.doc_mask import causal_document_mask
from kiln.model.matmul_attention import matmul_attention, uses_matmul_path
from kiln.model.second_derivative import refuse_second_derivative


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a matmul on `t` in: the autocast dtype where autocast is
    on (fp64 is left alone, as autocast leaves it), else `t`'s own."""
    device = t.device.type
    if torch.is_autocast_enabled(device) and t.dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return t.dtype


class _RMSNormFunction(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w over the last dim, in fp32 (fp64 for fp64), with a
    hand-written backward: on CPU autograd runs F.rms_norm as pow / mean / mul / rsqrt and their
    backwards, about 15 passes over the activations; this does 3 forward and 6 backward
    (6.4 ms against 9.7 ms per (4096 x 512) norm, forward + backward)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, out_dtype: torch.dtype):
        rstd = torch.linalg.vector_norm(x, 2, -1, keepdim=True)
        rstd = rstd.pow_(2).div_(x.shape[-1]).add_(eps).rsqrt_()
        normed = x * rstd
        ctx.save_for_backward(normed, weight, rstd)
        return (normed * weight).to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        refuse_second_derivative("RMSNorm")
        normed, weight, rstd = ctx.saved_tensors
        g = grad_out.to(normed.dtype)
        grad_weight = (g * normed).sum(dim=tuple(range(g.dim() - 1)))
        g = g.mul_(weight) if g is not grad_out else g * weight  # dL/d(normed)
        # dx = rstd * (g - normed * mean(g * normed))
        mean_dot = torch.linalg.vecdot(g, normed, dim=-1).unsqueeze(-1).div_(normed.shape[-1])
        grad_x = torch.addcmul(g, normed, mean_dot, value=-1).mul_(rstd)
        return grad_x, grad_weight, None, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics and gain in fp32 even for bf16 inputs: tiny variances underflow otherwise.
        # Under autocast the output is in the compute dtype: its consumers are matmuls that
        # would each cast it (q, k and v; gate and up), so casting once here saves passes.
        stat = torch.promote_types(x.dtype, torch.float32)  # fp64 stays fp64
        if torch.compiler.is_compiling():  # plain ops: the compiler fuses them, forward and backward
            xf = x.to(stat)
            normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (normed * self.weight.to(stat)).to(compute_dtype(x))
        return _RMSNormFunction.apply(x.to(stat), self.weight.to(stat), self.eps, compute_dtype(x))


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_len, head_dim) in the rotate-half layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[x1 cos - x2 sin, x2 cos + x1 sin] for half-width cos/sin, written half by half
    (two passes; x * cos + rotate_half(x) * sin takes five and a concatenated copy)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if torch.compiler.is_compiling():  # the compiler fuses this itself; `out=` views break it
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    out = torch.empty_like(x)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        refuse_second_derivative("RoPE")
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None  # a rotation's transpose: the angle negated


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) queries or keys by position; cos/sin are (T, D) tables in the
    rotate-half layout (both halves hold the same angles)."""
    half = x.shape[-1] // 2
    return _Rope.apply(x, cos[..., :half].to(x.dtype), sin[..., :half].to(x.dtype))


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention to the last `window` positions (key j visible from query i when
    0 <= i - j < window), in O(T * window) memory: the sequence is cut into blocks of
    `window` queries. Block 0 attends causally to itself; every later block to the one
    before it and itself, under one (window, 2 * window) band mask. No T x T mask is ever
    built, and SDPA sees 4-D inputs only (the blocks become batch rows), which its fused
    CUDA kernels need: 5-D inputs fall back to the math kernel, which builds the scores.
    With `doc_ids` (B, T) the masks also hide keys of other documents (per batch row)."""
    b, h, t, d = q.shape
    if t <= window:
        if doc_ids is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_document_mask(doc_ids))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    n = -(-t // window)
    pad = n * window - t  # padded keys sit in every real query's future: masked out

    def blocks(x: torch.Tensor) -> torch.Tensor:  # (B, n, H, window, D)
        return F.pad(x, (0, 0, 0, pad)).view(b, h, n, window, d).transpose(1, 2)

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    rows = b * (n - 1)

    def with_previous(x: torch.Tensor) -> torch.Tensor:  # (B * (n-1), H, 2 * window, D)
        return torch.cat([x[:, :-1], x[:, 1:]], dim=3).reshape(rows, h, 2 * window, d)

    i = torch.arange(window, device=q.device)[:, None]
    lag = i + window - torch.arange(2 * window, device=q.device)[None, :]  # query - key position
    band = (lag >= 0) & (lag < window)
    if doc_ids is None:
        first = F.scaled_dot_product_attention(qb[:, 0], kb[:, 0], vb[:, 0], is_causal=True)
    else:  # padded positions: a document of their own (-1), each sees itself
        ids = F.pad(doc_ids, (0, pad), value=-1).view(b, n, window)
        first = F.scaled_dot_product_attention(qb[:, 0], kb[:, 0], vb[:, 0],
                                               attn_mask=causal_document_mask(ids[:, 0]))
        keys = torch.cat([ids[:, :-1], ids[:, 1:]], dim=2).reshape(rows, 1, 2 * window)
        band = band & (ids[:, 1:].reshape(rows, window, 1) == keys)[:, None]
    rest = F.scaled_dot_product_attention(
        qb[:, 1:].reshape(rows, h, window, d), with_previous(kb), with_previous(vb),
        attn_mask=band)
    y = torch.cat([first[:, None], rest.view(b, n - 1, h, window, d)], dim=1)
    return y.transpose(1, 2).reshape(b, h, n * window, d)[:, :, :t]


def stacked_linear(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """[x W_1^T | x W_2^T | ...] for linears sharing their input, as one GEMM over the
    stacked weights; callers split the last dim. For q/k/v in bf16 training this makes the
    attention sublayer ~2 ms (3%) faster per layer at 4096 tokens, forward and backward,
    and the input gradient needs no sum of three. The parameters stay separate (checkpoints,
    export and per-matrix optimizers see the usual weights); the stack is built from the
    weights already cast to the autocast dtype. (Gate and up measured no faster: the
    stacked gradient costs a copy that eats the GEMM's gain.)"""
    return F.linear(x, torch.cat([w.to(compute_dtype(w)) for w in weights]))


class Attention(nn.Module):
    """Causal grouped-query attention through PyTorch's fused SDPA kernels.

    Options (all off gives Llama attention): `rope=False` for position-free (NoPE) layers,
    `window` > 0 for sliding-window (local) layers, `qk_norm` (RMSNorm over head_dim on q and
    k before RoPE) and `gate` (o = Wo[attn * sigmoid(x Wg)], one gate per channel). In
    training, `kernel` (auto | sdpa | matmul) picks Kiln's matmul attention or SDPA.
    `head_dim` (0: dim // n_heads) sets the head width apart from `dim`, as Trinity Large's
    48 heads of 128 at dim 3072. `doc_ids` (B, T) in forward restricts each query to keys of
    its own document (`kiln.model.doc_mask`), on every path but KV-cache decoding.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        *,
        rope: bool = True,
        window: int = 0,
        qk_norm: bool = False,
        gate: bool = False,
        norm_eps: float = 1e-5,
        kernel: str = "auto",
        head_dim: int = 0,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.kernel = kernel  # uses_matmul_path's choice: auto | sdpa | matmul
        self.head_dim = head_dim or dim // n_heads
        self.rope, self.window = rope, window
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.wg = nn.Linear(dim, n_heads * self.head_dim, bias=False) if gate else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        if doc_ids is not None and cache is not None:
            raise ValueError("document masking (doc_ids) is not supported with a KV cache: "
                             "decode one document at a time")
        if torch.is_grad_enabled():  # training: one GEMM (decoding keeps the weights as they are)
            weights = [self.wq.weight, self.wk.weight, self.wv.weight]
            q, k, v = stacked_linear(x, weights).split([w.shape[0] for w in weights], dim=-1)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = q.view(b, t, self.n_heads, self.head_dim)
        k = k.view(b, t, self.n_kv_heads, self.head_dim)
        v = v.view(b, t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        decoding = False
        if cache is not None:
            if t > 1 and cache.length:
                raise ValueError("prefill with a non-empty cache is not supported; reset it first")
            k, v = cache.update(k, v)
            decoding = t == 1 and k.shape[2] > 1  # one new token sees the whole cache
        if self.window and decoding:
            k, v = k[:, :, -self.window :], v[:, :, -self.window :]
        gqa = self.n_kv_heads != self.n_heads
        if cache is None and uses_matmul_path(q, self.kernel, self.window):
            y = matmul_attention(q, k, v, self.window, doc_ids)
        elif self.window and not decoding:
            if gqa:  # the banded path has no GQA kernel: share kv heads explicitly
                rep = self.n_heads // self.n_kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = sliding_window_attention(q, k, v, self.window, doc_ids)
        elif doc_ids is not None:  # (B, 1, T, T) mask: SDPA's memory-efficient kernel, not flash
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_document_mask(doc_ids),
                                               enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=not decoding, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(b, t, -1)
        if self.wg is not None:
            y = y * torch.sigmoid(self.wg(x))
        return self.wo(y)


class KVCache:
    """Per-layer key/value store for incremental decoding, preallocated: the buffers for
    `capacity` positions are made on the first update (when the batch, heads, dtype and
    device are known) and every token is written in place. Growing them with `torch.cat`
    copied the whole cache on every step, O(n^2) copying over one generation.

    A sliding-window layer (`window` > 0) never looks further back than `window` positions,
    so its buffers hold only those, as a ring: position p lives in slot p % window. Once
    the ring is full a decoding step gets it back as it lies, in slot order, not position
    order: keys are stored after RoPE and one new token sees every key of its window, so
    attention (a softmax and a weighted sum over the keys) is the same under any order of
    them, up to float summation order. Putting them in position order took two copies of
    the window per layer and step: 6% of decode time at a Trinity Nano-like shape (window
    2048, 2 kv heads of 128, 4 layers; 4% at trinity-tiny's) on a 2-core CPU."""

    def __init__(self, capacity: int, window: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"a KV cache needs a capacity > 0, got {capacity}")
        self.capacity = capacity
        self.window = window if 0 < window < capacity else 0  # 0: every position kept
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H, T, D) keys and values; returns everything attention may see: all
        positions so far, or for a ring the prompt's (prefill) or the last `window`, in
        position order until the ring is full, then in slot order (see the class)."""
        t = k.shape[2]
        end = self.length + t
        if end > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} positions cannot hold {end}")
        if self.window and t > 1 and self.length:
            raise ValueError("a sliding-window KV cache takes a prompt while empty, then one "
                             "token at a time")
        if self.k is None:
            b, h, _, d = k.shape
            slots = self.window or self.capacity
            self.k = k.new_empty(b, h, slots, d)
            self.v = v.new_empty(b, h, slots, v.shape[3])
        elif k.shape[:2] != self.k.shape[:2]:  # written in place, a batch of 1 would broadcast
            raise ValueError(f"KV cache holds batch x heads {tuple(self.k.shape[:2])}, "
                             f"got {tuple(k.shape[:2])}: reset it")
        if not self.window:
            self.k[:, :, self.length : end] = k
            self.v[:, :, self.length : end] = v
            self.length = end
            return self.k[:, :, :end], self.v[:, :, :end]
        first = max(self.length, end - self.window)  # the last `window` positions live on
        while first < end:  # at most two runs of slots: up to the ring's end, then from 0
            slot, i = first % self.window, first - self.length
            n = min(end - first, self.window - slot)
            self.k[:, :, slot : slot + n] = k[:, :, i : i + n]
            self.v[:, :, slot : slot + n] = v[:, :, i : i + n]
            first += n
        self.length = end
        if t > 1:  # prefill: its own queries see the whole prompt (banded by attention)
            return k, v
        if end <= self.window:  # slots past `end` hold nothing yet
            return self.k[:, :, :end], self.v[:, :, :end]
        return self.k, self.v


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
