"""`build_optimizer('adamw')` against a hand-written decoupled AdamW in fp64, over several
steps with a scheduled lr: which tensors decay (found here from the module types, not from
`ndim`), and the update rule itself."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.config import ModelConfig, OptimConfig
from kiln.model import Transformer
from kiln.model.layers import RMSNorm
from kiln.optim import build_optimizer


def _model(**kw) -> Transformer:
    base = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**base, **kw}))


def _decays(model: nn.Module) -> dict[int, bool]:
    """Decay by what holds the tensor: linear and embedding weights (a tied head once, as
    the embedding), MoE weight stacks, routers; never a norm gain."""
    decays: dict[int, bool] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            decays[id(p)] = not isinstance(module, RMSNorm) and name != "bias"
    return decays


def _reference_adamw(params, grads_per_step, lrs, decays, cfg: OptimConfig):
    """Loshchilov & Hutter's AdamW as torch writes it: p <- p (1 - lr wd), then the Adam
    step with bias-corrected moments; in fp64."""
    ps = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs, strict=True), start=1):
        for i, (p, g) in enumerate(zip(ps, grads, strict=True)):
            g = g.double()
            wd = cfg.weight_decay if decays[id(params[i])] else 0.0
            p.mul_(1 - lr * wd)
            m[i].mul_(cfg.beta1).add_(g, alpha=1 - cfg.beta1)
            v[i].mul_(cfg.beta2).addcmul_(g, g, value=1 - cfg.beta2)
            m_hat = m[i] / (1 - cfg.beta1 ** t)
            v_hat = v[i] / (1 - cfg.beta2 ** t)
            p.sub_(lr * m_hat / (v_hat.sqrt() + cfg.eps))
    return ps


@pytest.mark.parametrize("kw", [
    {"tie_embeddings": True}, {"tie_embeddings": False},
    {"n_experts": 4, "top_k": 2, "expert_hidden": 16, "qk_norm": True, "sandwich_norm": True},
])
def test_adamw_matches_a_hand_written_decoupled_adamw(kw):
    model = _model(**kw)
    cfg = OptimConfig(lr=1e-2, weight_decay=0.3, beta1=0.8, beta2=0.9, eps=1e-8)
    opt = build_optimizer(model, cfg)
    params = list(model.parameters())  # a tied weight once
    decays = _decays(model)
    by_group = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(by_group) == sum(len(g["params"]) for g in opt.param_groups) == len(params)
    assert {i: wd > 0 for i, wd in by_group.items()} == decays
    if kw.get("tie_embeddings"):
        assert decays[id(model.embed.weight)] and model.head.weight is model.embed.weight

    gen = torch.Generator().manual_seed(1)
    steps = [[torch.randn(p.shape, generator=gen) * 10 ** (i % 3 - 1) for i, p in
              enumerate(params)] for _ in range(5)]
    lrs = [cfg.lr * f for f in (0.25, 0.5, 1.0, 0.7, 0.1)]  # a schedule sets the group lr
    expected = _reference_adamw(params, steps, lrs, decays, cfg)
    for grads, lr in zip(steps, lrs, strict=True):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-6, atol=1e-7)
