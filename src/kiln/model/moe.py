"""Mixture-of-experts feed-forward layer with sigmoid routing (DeepSeek-V3 / Trinity style).

    s = sigmoid(x W_r)                       router logits and scores in fp32
    I = top-K of (s + b)                     b: balancing bias, steers selection only
    g_i = route_scale * s_i / sum_{j in I} s_j   for i in I   (unbiased scores)
    y = SharedSwiGLU(x) + sum_{i in I} g_i * Expert_i(x)

The routed experts' SwiGLU weights are 3-D tensors (E, hidden, dim) / (E, dim, hidden),
so per-expert optimizers (Muon) see one matrix per expert. Tokens are sorted by expert and
run through grouped matmuls (``torch.nn.functional.grouped_mm``) or, where that kernel is
unavailable for the device/dtype, a padded ``torch.bmm`` whose capacity is this batch's
largest expert load — no token is ever dropped either way.

Router init: the Hugging Face afmoe code zero-initialises W_r, which makes every score 0.5
and every top-K the same tie for every token — the first steps then send all tokens to the
same K experts (which ones is up to ``torch.topk``: on CPU 10-11 of 16 at top-2). We default to a small normal init (``router_init_std``) that
breaks the ties at random, so load starts near uniform; pass 0.0 for the zero init.

z-loss: we keep the ST-MoE form ``mean_t(logsumexp_i(logits)^2)`` for the sigmoid router.
It has no softmax to stabilise here, but it still does what Trinity adds it for: lse >= max
logit bounds the logits from above, and lse -> -inf when all logits sink, so both
directions of sigmoid saturation are penalised.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.balancing import ExpertBiasBalancer
from kiln.model.layers import SwiGLU, compute_dtype

EXPERT_BACKENDS = ("auto", "grouped_mm", "padded_bmm")


def select_experts(scores: torch.Tensor, bias: torch.Tensor, top_k: int) -> torch.Tensor:
    """Indices (N, K) of the top-K experts by biased score; the bias carries no gradient."""
    return torch.topk(scores.detach() + bias, top_k, dim=-1, sorted=False).indices


def route(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, route_scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores (N, E), expert indices (N, K), gates (N, K)) from fp32 router logits."""
    scores = torch.sigmoid(logits)
    idx = select_experts(scores, bias, top_k)
    picked = scores.gather(-1, idx)
    # + 1e-20 as Hugging Face's afmoe router: K scores that all underflow give gates of 0,
    # not nan
    gates = route_scale * picked / (picked.sum(-1, keepdim=True) + 1e-20)
    return scores, idx, gates


def sequence_aux_loss(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """DeepSeek-V3 sequence-wise balance loss sum_i f_i P_i (its eqs. 17-20), averaged over
    sequences.

    scores (B, T, E) sigmoid scores. f_i = E / (K T) * #tokens of the sequence whose top-K
    *unbiased* scores hold i (eq. 18 ranks s, not s + b; Megatron-core's aux-loss routing
    map does the same); P_i = mean_t s_i / sum_j s_j. The balancing bias steers which
    experts run, but the loss measures the router's own preference, so a bias that already
    evens the load out does not hide an imbalanced router from it.
    """
    b, t, n_experts = scores.shape
    chosen = torch.topk(scores.detach(), top_k, dim=-1, sorted=False).indices.reshape(b, t * top_k)
    counts = torch.zeros(b, n_experts, device=scores.device, dtype=scores.dtype)
    counts.scatter_add_(1, chosen, torch.ones_like(chosen, dtype=scores.dtype))
    f = counts * (n_experts / (top_k * t))
    p = (scores / scores.sum(-1, keepdim=True)).mean(1)
    return (f * p).sum(-1).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE z-loss mean over tokens of logsumexp(logits)^2 (see module docstring)."""
    return torch.logsumexp(logits, dim=-1).square().mean()


@functools.cache
def grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether F.grouped_mm runs forward and backward here (probed once per device/dtype;
    with gradients on even when first asked under no_grad, as eval is, since the answer
    is cached for training too)."""
    if not hasattr(F, "grouped_mm"):
        return False
    try:
        with torch.inference_mode(False), torch.enable_grad():
            return _probe_grouped_mm(device_type, dtype)
    except (RuntimeError, NotImplementedError, TypeError):
        return False


@torch.compiler.assume_constant_result
def _grouped_mm_works_here(device_type: str, dtype: torch.dtype) -> bool:
    """`grouped_mm_works` as the compiler sees it: a constant of the trace. Traced through,
    the probe (tensors made with requires_grad, a backward) broke the graph of every MoE
    layer in every compiled step."""
    return grouped_mm_works(device_type, dtype)


def _probe_grouped_mm(device_type: str, dtype: torch.dtype) -> bool:
    # fixed values, not random ones: the probe runs at the first MoE forward, where a
    # draw from the global generator would shift it by a step's place (resumed or not)
    x = _probe_values((32, 16), 0, device_type, dtype)
    w = _probe_values((2, 16, 16), 1, device_type, dtype)
    offs = torch.tensor([16, 32], device=device_type, dtype=torch.int32)
    y = F.grouped_mm(x, w.transpose(-2, -1), offs=offs)
    y.backward(torch.ones_like(y))
    ref = torch.cat([x[:16] @ w[0].T, x[16:] @ w[1].T]).float()
    return bool(torch.allclose(y.float(), ref, rtol=5e-2, atol=5e-2))


def _probe_values(shape: tuple[int, ...], salt: int, device_type: str,
                  dtype: torch.dtype) -> torch.Tensor:
    n = math.prod(shape)
    values = ((torch.arange(n) * 7 + salt) % 11 - 5).float().div_(8).view(shape)
    return values.to(device=device_type, dtype=dtype).requires_grad_()


def _contiguous_grad(t: torch.Tensor) -> torch.Tensor:
    """grouped_mm's backward rejects non-contiguous (e.g. expanded) output gradients."""
    if t.requires_grad:
        t.register_hook(lambda g: g.contiguous())
    return t


class RoutedExperts(nn.Module):
    """E SwiGLU experts stored as stacked weights, applied to tokens sorted by expert."""

    def __init__(self, dim: int, hidden: int, n_experts: int, backend: str = "auto"):
        super().__init__()
        if backend not in EXPERT_BACKENDS:
            raise ValueError(f"expert backend must be one of {EXPERT_BACKENDS}, got '{backend}'")
        self.backend = backend
        self.w_gate = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w_up = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w_down = nn.Parameter(torch.empty(n_experts, dim, hidden))

    def resolved_backend(self, x: torch.Tensor) -> str:
        if self.backend != "auto":
            return self.backend
        if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
            return "padded_bmm"  # the compiler's grouped_mm accepts bf16 only (eager: any)
        # grouped_mm wants every row stride a multiple of 16 bytes (dim and expert_hidden
        # multiples of 8 in bf16, 4 in fp32); the probe's 16 x 16 shapes always are
        aligned = all(n * x.element_size() % 16 == 0 for n in self.w_up.shape[1:])
        return ("grouped_mm" if aligned and _grouped_mm_works_here(x.device.type, x.dtype)
                else "padded_bmm")

    def forward(self, xs: torch.Tensor, counts: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """xs (M, D) sorted by expert with `counts` (E,) rows each; returns gate-weighted
        expert outputs (M, D) in the same order. Gates (M,) scale the hidden activations
        (equal to scaling the output: the down projection is linear)."""
        w_gate, w_up, w_down = (w.to(xs.dtype) for w in (self.w_gate, self.w_up, self.w_down))
        if self.resolved_backend(xs) == "grouped_mm":
            offs = counts.cumsum(0).to(torch.int32)
            h = F.silu(_contiguous_grad(F.grouped_mm(xs, w_gate.transpose(-2, -1), offs=offs)))
            h = h * _contiguous_grad(F.grouped_mm(xs, w_up.transpose(-2, -1), offs=offs))
            h = h * gates.unsqueeze(-1).to(h.dtype)
            return _contiguous_grad(F.grouped_mm(h, w_down.transpose(-2, -1), offs=offs))
        return self._padded_bmm(xs, counts, gates, w_gate, w_up, w_down)

    @staticmethod
    def _padded_bmm(xs, counts, gates, w_gate, w_up, w_down) -> torch.Tensor:
        n_experts, capacity = counts.shape[0], int(counts.max())
        expert = torch.repeat_interleave(torch.arange(n_experts, device=xs.device), counts)
        starts = counts.cumsum(0) - counts
        slot = torch.arange(xs.shape[0], device=xs.device) - starts[expert]
        buf = xs.new_zeros(n_experts, capacity, xs.shape[1])
        buf = buf.index_put((expert, slot), xs)  # padding rows stay 0 -> contribute 0
        h = F.silu(torch.bmm(buf, w_gate.transpose(1, 2))) * torch.bmm(buf, w_up.transpose(1, 2))
        g = xs.new_zeros(n_experts, capacity).index_put((expert, slot), gates.to(xs.dtype))
        y = torch.bmm(h * g.unsqueeze(-1), w_down.transpose(1, 2))
        return y[expert, slot]


class MoE(nn.Module):
    """Sigmoid-routed MoE FFN with a shared expert and loss-free bias balancing.

    After each forward in training mode the layer holds, for the trainer:
    ``aux_loss`` (scalar tensor: seq_aux_coef * seq-aux + z_loss_coef * z-loss, add it to
    the training loss; None after a forward in eval mode without gradients, which has no use
    for it) and ``last_counts`` (tokens per expert, after every forward). Counts accumulate in the
    balancer until ``update_bias()`` is called once per optimizer step; it returns them.
    """

    def __init__(
        self,
        dim: int,
        expert_hidden: int,
        n_experts: int,
        top_k: int,
        n_shared: int = 1,
        route_scale: float = 1.0,
        balance: str = "smebu",
        balance_rate: float = 5e-4,
        smebu_beta: float = 0.5,
        smebu_kappa: float = 2.0,
        seq_aux_coef: float = 0.0,
        z_loss_coef: float = 0.0,
        router_init_std: float = 0.02,
        init_std: float = 0.02,
        backend: str = "auto",
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if n_shared < 0 or expert_hidden <= 0 or dim <= 0:
            raise ValueError("dim and expert_hidden must be > 0 and n_shared >= 0")
        if route_scale <= 0 or seq_aux_coef < 0 or z_loss_coef < 0 or router_init_std < 0:
            raise ValueError("route_scale must be > 0; loss coefficients and init std >= 0")
        self.dim, self.n_experts, self.top_k = dim, n_experts, top_k
        self.route_scale = route_scale
        self.seq_aux_coef, self.z_loss_coef = seq_aux_coef, z_loss_coef
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = RoutedExperts(dim, expert_hidden, n_experts, backend)
        self.shared = SwiGLU(dim, n_shared * expert_hidden) if n_shared > 0 else None
        self.balancer = ExpertBiasBalancer(n_experts, balance, balance_rate, smebu_beta, smebu_kappa)
        self.aux_loss: torch.Tensor | None = torch.zeros(())
        self.last_counts: torch.Tensor = torch.zeros(n_experts, dtype=torch.int64)
        self.reset_parameters(init_std, router_init_std)

    def reset_parameters(self, std: float = 0.02, router_std: float = 0.02, n_layers: int = 1) -> None:
        """Normal(0, std) in-projections, std/sqrt(2 n_layers) down projections (as the dense
        model), Normal(0, router_std) router (0 gives the HF afmoe zero init)."""
        down_std = std / math.sqrt(2 * n_layers)
        if router_std > 0:
            nn.init.normal_(self.router.weight, 0.0, router_std)
        else:
            nn.init.zeros_(self.router.weight)
        nn.init.normal_(self.experts.w_gate, 0.0, std)
        nn.init.normal_(self.experts.w_up, 0.0, std)
        nn.init.normal_(self.experts.w_down, 0.0, down_std)
        if self.shared is not None:
            nn.init.normal_(self.shared.w_gate.weight, 0.0, std)
            nn.init.normal_(self.shared.w_up.weight, 0.0, std)
            nn.init.normal_(self.shared.w_down.weight, 0.0, down_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MoE expects (batch, seq, {self.dim}) input, got {tuple(x.shape)}")
        b, t, d = x.shape
        x2 = x.reshape(b * t, d)
        with torch.autocast(x.device.type, enabled=False):  # router in fp32
            rdtype = torch.promote_types(x2.dtype, torch.float32)  # fp32, fp64 for fp64
            logits = F.linear(x2.to(rdtype), self.router.weight.to(rdtype))
            scores, idx, gates = route(logits, self.balancer.bias, self.top_k, self.route_scale)

        flat = idx.reshape(-1)
        # tokens per expert; bincount's output shape depends on the data, which breaks a
        # compiled graph at every MoE layer: a scatter into n_experts slots does not
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        ys = self.experts(x2[token].to(compute_dtype(x)), counts, gates.reshape(-1)[order])
        out = torch.zeros(b * t, d, device=x.device, dtype=ys.dtype).index_add(0, token, ys)
        if self.shared is not None:
            out = out + self.shared(x2)
        out = out.to(x.dtype).reshape(b, t, d)

        self.last_counts = counts.detach()
        wanted = self.aux_wanted()
        self.aux_loss = self._aux_loss(logits, scores.reshape(b, t, -1)) if wanted else None
        if self.training:
            self.balancer.record(counts)
        return out

    def aux_wanted(self) -> bool:
        """Whether a forward computes `aux_loss`: only a loss that can be trained on needs it
        (training mode, or gradients on). Eval and generation (eval mode, no gradients) skip
        it: the second top-K and the logsumexp were about a quarter of the layer's time per
        decoded token (CPU, dim 256, 16 experts, top-2), a few percent on a 4096-token batch.
        Neither loss set (both coefficients 0): there is none, so the train records carry no
        `aux_loss` (a 0.0 read as a balance loss that had reached zero)."""
        if self.seq_aux_coef == 0 and self.z_loss_coef == 0:
            return False
        return self.training or torch.is_grad_enabled()

    def _aux_loss(self, logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        aux = logits.new_zeros(())
        if self.seq_aux_coef > 0:
            aux = aux + self.seq_aux_coef * sequence_aux_loss(scores, self.top_k)
        if self.z_loss_coef > 0:
            aux = aux + self.z_loss_coef * router_z_loss(logits)
        return aux

    def update_bias(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
                    ) -> torch.Tensor:
        """One balancing step from the counts recorded since the last call, summed over
        ranks by `reduce` (the trainer passes one from kiln.parallel)."""
        return self.balancer.update(reduce)
