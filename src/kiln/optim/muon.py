"""Muon for hidden matrices, AdamW for everything else, in one optimizer.

Muon (Keller Jordan et al., 2024; "Muon is Scalable", arXiv 2502.16982) runs Nesterov
momentum and replaces the update by an approximately orthogonal matrix with the same row and
column spaces (quintic Newton-Schulz in bf16). One `torch.optim.Optimizer` holds both kinds
of group (`use_muon` flag) so the trainer's `group["lr"]` schedule, gradient clipping and
torch.distributed.checkpoint's get/set_optimizer_state_dict work unchanged.

Each group carries `lr_scale`, its lr as a multiple of `optim.lr`: a schedule sets
`group["lr"] = optim.lr * multiplier * group["lr_scale"]`, which keeps Muon's own lr ratio.

Under FSDP2 parameters are DTensors sharded on dim 0. Momentum stays on the local shard
(ZeRO-1 style, as Moonshot's distributed Muon); the update is all-gathered with
`full_tensor()`, orthogonalised, and each rank keeps its own slice. Expert stacks
(E, out, in) sharded over experts need no gather: each expert is orthogonalised alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.optim.adam import adam

from kiln.config import OptimConfig
from kiln.optim.routing import route_parameters
from kiln.train.precision import has_fast_bf16

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # quintic, maximal slope at 0 (Keller Jordan)
NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ADJUST_LR_RULES = ("original", "match_rms_adamw")
DEFAULT_MUON_LR = 0.02  # "spectral units", for the 'original' rule


def newton_schulz(
    g: Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Approximate polar factor U V^T of each matrix in the last two dims of `g`.

    Leading dims are a batch (MoE experts): each matrix is normalised and iterated on its
    own. Tall matrices are transposed so the Gram matrix X X^T is the small one. Singular
    values end near 0.7-1.2, not exactly 1: the coefficients trade accuracy for speed."""
    if g.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    # contiguous whatever the input's layout: the norm's reduction order, and so its
    # rounding, then depends only on the values (grouped, transposed and plain agree)
    x = (x.mT if tall else x).contiguous()
    if x.ndim == 2:  # the 2-D path uses the same kernels as torch.optim.Muon
        x = x / (x.norm() + eps)
        for _ in range(steps):
            gram = x @ x.T
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, poly, x, beta=a)
    else:
        batch = x.shape[:-2]
        x = x.reshape(-1, *x.shape[-2:])
        x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
        for _ in range(steps):
            gram = x @ x.mT
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
        x = x.reshape(*batch, *x.shape[-2:])
    return x.mT if tall else x


def adjusted_lr(lr: float, rule: str, shape: torch.Size | tuple[int, ...]) -> float:
    """Muon's per-shape lr: 'original' sqrt(max(1, out/in)) (Keller Jordan; Trinity) or
    'match_rms_adamw' 0.2 sqrt(max(out, in)), which gives updates of RMS ~0.2 like AdamW's
    (Moonshot), so Muon can share AdamW's lr and weight decay."""
    return lr * _lr_ratio(rule, tuple(shape))


@functools.cache
def _lr_ratio(rule: str, shape: tuple[int, ...]) -> float:
    """adjusted_lr / lr; cached: the optimizer asks for it for every matrix on every step."""
    rows, cols = shape[-2], shape[-1]
    if rule == "original":
        return math.sqrt(max(1, rows / cols))
    if rule == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"unknown Muon lr rule '{rule}'; use one of {list(ADJUST_LR_RULES)}")


def _local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (an alias: in-place ops write through), else `t`."""
    return t.to_local() if isinstance(t, DTensor) else t


def orthogonalize(update: Tensor, like: Tensor, steps: int,
                  coefficients: tuple[float, float, float], eps: float,
                  dtype: torch.dtype) -> Tensor:
    """Newton-Schulz of the full logical matrix whose local shard is `update`.

    `like` is the parameter (a DTensor under FSDP2) that says how the matrix is laid out.
    Returns the local shard of the orthogonalised update."""
    if not isinstance(like, DTensor):
        return newton_schulz(update, steps, coefficients, eps, dtype)
    ndim = like.ndim
    matrix_dims = (ndim - 2, ndim - 1)
    if any(not isinstance(pl, Shard | Replicate) for pl in like.placements):
        raise NotImplementedError(f"Muon on a DTensor with placements {like.placements}")
    if all(isinstance(pl, Replicate) or pl.dim % ndim not in matrix_dims
           for pl in like.placements):
        # only experts are split across ranks: every local matrix is whole
        return newton_schulz(update, steps, coefficients, eps, dtype)
    mesh, placements = like.device_mesh, like.placements
    full = DTensor.from_local(update, mesh, placements, run_check=False,
                              shape=like.shape, stride=like.stride()).full_tensor()
    ortho = newton_schulz(full, steps, coefficients, eps, dtype)
    return distribute_tensor(ortho, mesh, placements, src_data_rank=None).to_local()


def orthogonalize_grouped(updates: list[Tensor], steps: int,
                          coefficients: tuple[float, float, float], eps: float,
                          dtype: torch.dtype, out_dtype: torch.dtype | None = None
                          ) -> list[Tensor]:
    """`newton_schulz` of each update (2-D matrix or 3-D expert stack), run once per shape.

    A small model has dozens of matrices of a few shapes (and expert stacks of the same
    per-expert shape); iterating each alone is dominated by per-call overhead. Matrices are
    brought to wide orientation (rows <= cols), cast to `dtype` and stacked, so one batched
    iteration serves every matrix of an oriented shape. Each matrix is still normalised and
    iterated on its own, so the result equals the one-by-one path. A shape held by a single
    2-D matrix takes the 2-D path itself (the kernels of torch.optim.Muon). Returns updates
    in `out_dtype` (default `dtype`; one cast per shape, not per matrix), each shaped like
    its input."""
    out_dtype = out_dtype or dtype
    buckets: dict[tuple[int, int, torch.device], list[int]] = {}
    for i, u in enumerate(updates):
        if u.ndim not in (2, 3):
            raise ValueError(f"Muon takes 2-D weights or 3-D expert stacks, got {tuple(u.shape)}")
        rows, cols = u.shape[-2:]
        buckets.setdefault((min(rows, cols), max(rows, cols), u.device), []).append(i)
    out: list[Tensor | None] = [None] * len(updates)
    for (rows, cols, device), idx in buckets.items():
        if len(idx) == 1 and updates[idx[0]].ndim == 2:
            out[idx[0]] = newton_schulz(updates[idx[0]], steps, coefficients, eps,
                                        dtype).to(out_dtype)
            continue
        counts = [updates[i].shape[0] if updates[i].ndim == 3 else 1 for i in idx]
        stack = torch.empty(sum(counts), rows, cols, dtype=dtype, device=device)
        start = 0
        for i, n in zip(idx, counts):
            u = updates[i]
            stack[start:start + n].copy_(u.mT if u.size(-2) > u.size(-1) else u)
            start += n
        ortho = newton_schulz(stack, steps, coefficients, eps, dtype).to(out_dtype)
        start = 0
        for i, n in zip(idx, counts):
            u, piece = updates[i], ortho[start:start + n]
            piece = piece.mT if u.size(-2) > u.size(-1) else piece
            out[i] = piece if u.ndim == 3 else piece[0]
            start += n
    return out


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on groups with `use_muon=True`, AdamW (torch's kernels) on the others.

    Muon group keys: lr, weight_decay, momentum, nesterov, ns_steps, ns_coefficients, eps,
    adjust_lr ('original' | 'match_rms_adamw'), ns_dtype ('bf16' | 'fp32'), lr_scale.
    AdamW group keys: lr, betas, eps, weight_decay, fused, lr_scale."""

    def __init__(self, param_groups: list[dict[str, Any]]):
        super().__init__(param_groups, {})

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = {"lr_scale": 1.0, **group}
        if "use_muon" not in group:
            raise ValueError("each param group needs 'use_muon' (True: Muon, False: AdamW)")
        need = (("lr", "weight_decay", "momentum", "nesterov", "ns_steps", "ns_coefficients",
                 "eps", "adjust_lr", "ns_dtype") if group["use_muon"]
                else ("lr", "betas", "eps", "weight_decay", "fused"))
        missing = [k for k in need if k not in group]
        if missing:
            kind = "Muon" if group["use_muon"] else "AdamW"
            raise ValueError(f"{kind} param group is missing {missing}")
        if group["lr"] < 0 or group["weight_decay"] < 0:
            raise ValueError("lr and weight_decay must be >= 0")
        if group["use_muon"]:
            if not 0.0 <= group["momentum"] < 1.0:
                raise ValueError(f"Muon momentum must be in [0, 1), got {group['momentum']}")
            if not isinstance(group["ns_steps"], int) or group["ns_steps"] < 1:
                raise ValueError(f"Muon ns_steps must be an int >= 1, got {group['ns_steps']}")
            if group["adjust_lr"] not in ADJUST_LR_RULES:
                raise ValueError(f"Muon adjust_lr '{group['adjust_lr']}' is not one of "
                                 f"{list(ADJUST_LR_RULES)}")
            if group["ns_dtype"] not in NS_DTYPES:
                raise ValueError(f"Muon ns_dtype '{group['ns_dtype']}' is not one of "
                                 f"{list(NS_DTYPES)}")
            params = group["params"]
            params = [params] if isinstance(params, Tensor) else list(params)
            for p in params:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D weights or 3-D expert stacks, got a "
                                     f"parameter of shape {tuple(p.shape)}; use AdamW for it")
        super().add_param_group(group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _muon_step(self, group: dict[str, Any]) -> None:
        lr, wd, beta = group["lr"], group["weight_decay"], group["momentum"]
        dtype = NS_DTYPES[group["ns_dtype"]]
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
        grads = [_local(p.grad) for p in params]
        bufs = [_local(self.state[p]["momentum_buffer"]) for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - beta)  # buf = beta buf + (1 - beta) g
        updates = torch._foreach_lerp(grads, bufs, beta) if group["nesterov"] else bufs
        plain = [i for i, p in enumerate(params) if not isinstance(p, DTensor)]
        orthos: dict[int, Tensor] = {}
        if plain:
            # cast back to the weights' dtype once per shape, not once per matrix in add_
            weight_dtypes = {params[i].dtype for i in plain}
            out_dtype = weight_dtypes.pop() if len(weight_dtypes) == 1 else None
            orthos.update(zip(plain, orthogonalize_grouped(
                [updates[i] for i in plain], group["ns_steps"], group["ns_coefficients"],
                group["eps"], dtype, out_dtype=out_dtype)))
        for i, p in enumerate(params):
            if i not in orthos:  # FSDP2: gather, orthogonalise and re-slice one by one
                orthos[i] = orthogonalize(updates[i], p, group["ns_steps"],
                                          group["ns_coefficients"], group["eps"], dtype)
        # decoupled weight decay with the unscaled lr, then the update with Muon's own lr;
        # one foreach call per distinct lr (a handful of shapes), same arithmetic as add_
        weights = [_local(p) for p in params]
        torch._foreach_mul_(weights, 1 - lr * wd)
        by_lr: dict[float, list[int]] = {}
        for i, p in enumerate(params):
            by_lr.setdefault(_lr_ratio(group["adjust_lr"], p.shape), []).append(i)
        for ratio, idx in by_lr.items():
            torch._foreach_add_([weights[i] for i in idx], [orthos[i] for i in idx],
                                alpha=-lr * ratio)

    def _adamw_step(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                device = p.device if group["fused"] else "cpu"
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adam(params, grads, exp_avgs, exp_avg_sqs, [], steps,
             foreach=None, fused=group["fused"],
             decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
             lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
             maximize=False)


def resolve_ns_dtype(name: str, device: torch.device) -> str:
    """'auto': bf16 on GPUs with bf16 tensor cores and on CPUs with native bf16 (AVX-512
    BF16 / AMX; there bf16 NS measured ~3x faster than fp32), fp32 elsewhere: on other CPUs
    and on GPUs before Ampere (V100, T4) bf16 matmuls are emulated, no faster than fp32 and
    less precise (as `train.precision = 'auto'` decides, kiln.train.precision)."""
    if name != "auto":
        if name not in NS_DTYPES:
            raise ValueError(f"muon_ns_dtype '{name}' is not one of {['auto', *NS_DTYPES]}")
        return name
    return "bf16" if has_fast_bf16(device) else "fp32"


def muon_peak_lr(cfg: OptimConfig) -> float:
    """The peak lr of the Muon groups: `optim.muon_lr`, or where it is 0, 0.02 under the
    'original' rule and `optim.lr` under 'match_rms_adamw' (whose updates are AdamW-sized)."""
    if cfg.muon_lr:
        return cfg.muon_lr
    return DEFAULT_MUON_LR if cfg.muon_adjust_lr == "original" else cfg.lr


def build_muon(model: nn.Module, cfg: OptimConfig) -> MuonWithAdamW:
    """Muon + AdamW from an `OptimConfig` (its muon_* fields). Momentum 0.95, Nesterov and
    5 steps are the paper's; lr 0.02 is Keller Jordan's for the 'original' rule; weight
    decay 0.1 is torch.optim.Muon's and Moonshot's, there with a far smaller lr (README)."""
    rule = cfg.muon_adjust_lr
    muon_lr = muon_peak_lr(cfg)
    routing = route_parameters(model)
    device = next(model.parameters()).device
    # fused AdamW is bitwise-deterministic on CPU and CUDA; DTensors (FSDP2) need foreach
    fused = not any(isinstance(p, DTensor) for p in model.parameters())
    adamw = {"use_muon": False, "lr": cfg.lr, "lr_scale": 1.0,
             "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, "fused": fused}
    groups = [
        {"params": [p for _, p in routing.muon], "use_muon": True, "lr": muon_lr,
         "lr_scale": muon_lr / cfg.lr,
         "weight_decay": cfg.muon_weight_decay,
         "momentum": cfg.muon_momentum,
         "nesterov": cfg.muon_nesterov,
         "ns_steps": cfg.muon_ns_steps,
         "ns_coefficients": NS_COEFFICIENTS, "eps": 1e-7, "adjust_lr": rule,
         "ns_dtype": resolve_ns_dtype(cfg.muon_ns_dtype, device)},
        # as in plain AdamW: matrices (embeddings, head, router) decay, vectors never do
        {**adamw, "params": [p for _, p in routing.adamw if p.ndim >= 2],
         "weight_decay": cfg.weight_decay},
        {**adamw, "params": [p for _, p in routing.adamw if p.ndim < 2], "weight_decay": 0.0},
    ]
    return MuonWithAdamW([g for g in groups if g["params"]])
