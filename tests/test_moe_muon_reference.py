"""One training step of a Trinity MoE model under Muon + AdamW, against the papers written
out by hand: which parameters each optimizer takes, Muon's update per expert matrix
(papers/muon.md), AdamW's first step, and the SMEBU bias step from counts of a reference
router (papers/trinity.md), which stays out of the gradient."""

from __future__ import annotations

import math

import torch
from test_muon import paper_muon_step

from kiln.config import ModelConfig, OptimConfig
from kiln.model import Transformer
from kiln.optim import build_optimizer

CFG = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16,
                  n_experts=4, top_k=2, expert_hidden=16, n_dense_layers=1, qk_norm=True,
                  attn_gate=True, sandwich_norm=True, local_per_global=1, sliding_window=8,
                  global_rope=False, balance="smebu", balance_rate=0.01, seq_aux_coef=0.1,
                  router_init_std=0.3)
OPT = OptimConfig(name="muon", lr=1e-2, weight_decay=0.2, muon_lr=0.03, muon_weight_decay=0.3,
                  muon_ns_dtype="fp32", eps=1e-8, beta1=0.9, beta2=0.95)


def reference_counts(model: Transformer, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Tokens per expert of each MoE layer: top-K of sigmoid(x W_r) + b, from the layer's
    input as hooked, routed by hand."""
    counts, hooks = [], []
    for moe in model.moe_layers():
        def hook(mod, args, counts=counts):
            x = args[0].reshape(-1, CFG.dim).double()
            s = torch.sigmoid(x @ mod.router.weight.double().T)
            idx = torch.topk(s + mod.balancer.bias.double(), CFG.top_k, dim=-1).indices
            counts.append(torch.bincount(idx.flatten(), minlength=CFG.n_experts))
        hooks.append(moe.register_forward_pre_hook(hook))
    with torch.no_grad():
        model.eval()(tokens[:, :-1])  # eval: this pass is not counted for balancing
    model.train()
    for h in hooks:
        h.remove()
    return counts


def test_one_step_follows_the_papers():
    torch.manual_seed(0)
    model = Transformer(CFG)
    with torch.no_grad():  # a nonzero balancing bias, so selection really uses it
        for moe in model.moe_layers():
            moe.balancer.bias.copy_(0.05 * torch.randn(CFG.n_experts))
    tokens = torch.randint(0, CFG.vocab_size, (3, 13), generator=torch.Generator().manual_seed(1))
    want_counts = reference_counts(model, tokens)
    bias0 = [m.balancer.bias.clone() for m in model.moe_layers()]

    opt = build_optimizer(model, OPT)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = model(tokens[:, :-1], targets=tokens[:, 1:]) + model.aux_loss()
    loss.backward()
    assert math.isfinite(loss.item())
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(not m.balancer.bias.requires_grad for m in model.moe_layers())
    opt.step()
    got_counts = [m.update_bias() for m in model.moe_layers()]

    for name, p in model.named_parameters():
        w, g = before[name].clone(), grads[name]
        if p.ndim >= 2 and "router" not in name and name not in ("embed.weight", "head.weight"):
            # Muon, 'original' rule: lr sqrt(max(1, out/in)) per matrix (per expert in a stack)
            paper_muon_step(w, torch.zeros_like(w), g, OPT.muon_lr, OPT.muon_weight_decay,
                            OPT.muon_momentum, True)
        else:  # AdamW, first step: m_hat = g, v_hat = g^2; 1-D tensors never decay
            wd = OPT.weight_decay if p.ndim >= 2 else 0.0
            w = w * (1 - OPT.lr * wd) - OPT.lr * g / (g.abs() + OPT.eps)
        torch.testing.assert_close(p.detach(), w, rtol=0, atol=2e-6, msg=name)

    lam, beta, kappa = CFG.balance_rate, CFG.smebu_beta, CFG.smebu_kappa
    for moe, b0, want, got in zip(model.moe_layers(), bias0, want_counts, got_counts, strict=True):
        assert got.tolist() == want.tolist()
        n = want.double()
        u = lam * torch.tanh(kappa * (n.mean() - n) / n.mean())
        m = (1 - beta) * (u - u.mean())  # momentum starts at zero
        torch.testing.assert_close(moe.balancer.momentum.double(), m, rtol=0, atol=1e-9)
        torch.testing.assert_close(moe.balancer.bias.double(), b0.double() + m, rtol=0, atol=1e-8)
        assert (m > 0).tolist() == (n < n.mean()).tolist()  # underloaded experts gain
