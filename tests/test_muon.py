"""Muon: Newton-Schulz invariants, the update rule, routing, torch.optim.Muon parity, resume."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kiln.config import ModelConfig, OptimConfig
from kiln.model import Transformer
from kiln.optim import build_optimizer
from kiln.optim.muon import (
    MuonWithAdamW,
    adjusted_lr,
    newton_schulz,
    orthogonalize_grouped,
    resolve_ns_dtype,
)
from kiln.optim.routing import ParamRouting, check_coverage, route_parameters
from kiln.parallel.distributed import DistEnv
from kiln.train.checkpoint import load_checkpoint, save_checkpoint
from kiln.train.precision import cpu_has_fast_bf16

DTYPES = [torch.float32, torch.bfloat16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def polar(g: torch.Tensor) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    return u @ vh


def muon_group(params, **over) -> dict:
    group = {"params": params, "use_muon": True, "lr": 0.1, "weight_decay": 0.0,
             "momentum": 0.95, "nesterov": True, "ns_steps": 5,
             "ns_coefficients": (3.4445, -4.7750, 2.0315), "eps": 1e-7,
             "adjust_lr": "original", "ns_dtype": "fp32"}
    return {**group, **over}


# -- 1, 2, 4: the Newton-Schulz iteration ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(32, 128), (128, 32)])
def test_singular_values_in_band_and_transpose_equivariance(shape, dtype):
    g = torch.randn(*shape, generator=gen(0))
    x = newton_schulz(g, dtype=dtype)
    assert x.shape == g.shape and x.dtype == dtype
    s = torch.linalg.svdvals(x.double())
    assert s.min() >= 0.6 and s.max() <= 1.25, (s.min(), s.max())
    assert torch.linalg.svdvals(g.double()).max() > 5  # the input was far from the band
    torch.testing.assert_close(newton_schulz(g.T, dtype=dtype), x.T, rtol=0, atol=0)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_scale_invariance(dtype, atol):
    g = torch.randn(48, 96, generator=gen(1))
    ref = newton_schulz(g, dtype=dtype).float()
    for c in (1e-3, 1.0, 1e3):
        torch.testing.assert_close(newton_schulz(c * g, dtype=dtype).float(), ref,
                                   rtol=0, atol=atol)


@pytest.mark.parametrize("shape", [(64, 256), (200, 80)])
def test_direction_matches_svd_polar_factor(shape):
    """Well-conditioned G (singular values spread log-uniformly over [0.1, 1])."""
    u, _, vh = torch.linalg.svd(torch.randn(*shape, generator=gen(2)), full_matrices=False)
    g = u @ torch.diag(torch.logspace(-1, 0, min(shape))) @ vh
    target = polar(g).flatten()
    x = newton_schulz(g).double().flatten()
    assert torch.cosine_similarity(x, target, dim=0) > 0.95
    # the raw gradient is much further from the polar factor: the check has teeth
    assert torch.cosine_similarity(g.double().flatten(), target, dim=0) < 0.9


def test_expert_stack_is_orthogonalised_per_expert_not_flattened():
    g = torch.randn(4, 24, 16, generator=gen(3)) * torch.tensor([1e-3, 1.0, 10.0, 1e3])[:, None, None]
    x = newton_schulz(g, dtype=torch.float32)
    for e in range(4):
        torch.testing.assert_close(x[e], newton_schulz(g[e], dtype=torch.float32),
                                   rtol=1e-5, atol=1e-6)
    flat = newton_schulz(g.reshape(-1, 16), dtype=torch.float32).reshape(4, 24, 16)
    assert (flat - x).abs().max() > 0.1


def test_newton_schulz_rejects_vectors():
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.ones(5))


# -- 3, 6: the update rule ------------------------------------------------------------------


def test_first_step_is_scaled_newton_schulz_of_gradient_and_step_two_repeats_it():
    w = nn.Parameter(torch.randn(48, 16, generator=gen(4)))  # tall: sqrt(48/16) lr scale
    e = nn.Parameter(torch.randn(3, 8, 24, generator=gen(5)))  # expert stack, wide
    opt = MuonWithAdamW([muon_group([w, e], lr=0.1)])
    gw, ge = torch.randn(48, 16, generator=gen(6)), torch.randn(3, 8, 24, generator=gen(7))
    expect_w = -0.1 * math.sqrt(3) * newton_schulz(gw, dtype=torch.float32)
    expect_e = -0.1 * newton_schulz(ge, dtype=torch.float32)
    for _ in range(2):
        before_w, before_e = w.detach().clone(), e.detach().clone()
        w.grad, e.grad = gw.clone(), ge.clone()
        opt.step()
        torch.testing.assert_close(w.detach() - before_w, expect_w, rtol=0, atol=1e-6)
        torch.testing.assert_close(e.detach() - before_e, expect_e, rtol=0, atol=1e-6)


def test_decoupled_weight_decay_uses_the_unscaled_lr():
    # a tall matrix: the `original` rule scales the update's lr by sqrt(48 / 16), not the decay's
    w = nn.Parameter(torch.randn(48, 16, generator=gen(8)))
    w0 = w.detach().clone()
    opt = MuonWithAdamW([muon_group([w], lr=0.05, weight_decay=0.5)])
    w.grad = torch.randn(48, 16, generator=gen(9))
    opt.step()
    expect = (w0 * (1 - 0.05 * 0.5)
              - 0.05 * math.sqrt(3) * newton_schulz(w.grad, dtype=torch.float32))
    torch.testing.assert_close(w.detach(), expect, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (128, 128)])
def test_match_rms_adamw_gives_update_rms_of_0_2(shape):
    u = polar(torch.randn(*shape, generator=gen(10))).float()
    rms = (adjusted_lr(1.0, "match_rms_adamw", shape) * u).pow(2).mean().sqrt()
    assert rms.item() == pytest.approx(0.2, rel=1e-5)
    # through the optimizer, with Newton-Schulz's wobbly singular values
    w = nn.Parameter(torch.zeros(*shape))
    w.grad = torch.randn(*shape, generator=gen(11))
    MuonWithAdamW([muon_group([w], lr=1.0, adjust_lr="match_rms_adamw")]).step()
    assert 0.16 < w.detach().pow(2).mean().sqrt().item() < 0.24


def test_original_rule():
    assert adjusted_lr(0.02, "original", (300, 100)) == pytest.approx(0.02 * math.sqrt(3))
    assert adjusted_lr(0.02, "original", (8, 100, 300)) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="original"):
        adjusted_lr(0.02, "spectral", (3, 3))


# -- 8: parity with torch.optim.Muon --------------------------------------------------------


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("rule", ["original", "match_rms_adamw"])
def test_matches_torch_muon_over_five_steps(nesterov, rule):
    shapes = [(64, 32), (32, 96), (48, 48)]
    ours = [nn.Parameter(torch.randn(*s, generator=gen(20 + i))) for i, s in enumerate(shapes)]
    ref = [nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    flags = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": nesterov}
    opt = MuonWithAdamW([muon_group(ours, **flags, adjust_lr=rule, ns_dtype="bf16")])
    ref_opt = torch.optim.Muon(ref, **flags, adjust_lr_fn=rule)
    g = gen(30)
    for _ in range(5):
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        ref_opt.step()
    for a, b, a0 in zip(ours, ref, start):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)
        assert (a.detach() - a0).abs().max() > 1e-2  # five real steps were taken


# -- the AdamW half -------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_groups_match_torch_adamw(fused):
    shapes = [(10, 6), (6,)]
    ours = [nn.Parameter(torch.randn(*s, generator=gen(40 + i))) for i, s in enumerate(shapes)]
    ref = [nn.Parameter(p.detach().clone()) for p in ours]
    opt = MuonWithAdamW([{"params": ours, "use_muon": False, "lr": 1e-2, "betas": (0.9, 0.95),
                          "eps": 1e-8, "weight_decay": 0.1, "fused": fused}])
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                fused=fused)
    g = gen(41)
    for _ in range(4):
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0)


# -- 5: routing -----------------------------------------------------------------------------


class TinyMoE(nn.Module):
    """Parameter layout of an MoE layer: router, expert stacks, a norm and a bias."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.norm = nn.LayerNorm(8)
        self.router = nn.Linear(8, 4, bias=False)
        self.w_in = nn.Parameter(torch.randn(4, 16, 8))
        self.w_out = nn.Parameter(torch.randn(4, 8, 16))
        self.shared = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 50, bias=False)


def tiny_transformer(tie: bool) -> Transformer:
    return Transformer(ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                   max_seq_len=32, tie_embeddings=tie))


@pytest.mark.parametrize("tie", [True, False])
def test_routing_of_the_transformer_covers_every_parameter_once(tie):
    model = tiny_transformer(tie)
    r = route_parameters(model)
    muon, adamw = dict(r.muon), dict(r.adamw)
    assert not muon.keys() & adamw.keys()
    ids = [id(p) for p in muon.values()] + [id(p) for p in adamw.values()]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert "embed.weight" in adamw and "norm.weight" in adamw
    assert ("head.weight" in adamw) == (not tie)
    assert all(p.ndim == 2 for p in muon.values()) and len(muon) == 2 * 7
    assert all(n.startswith("layers.") and "norm" in n or n in ("embed.weight", "head.weight",
                                                                "norm.weight") for n in adamw)


def test_routing_of_moe_parameters():
    r = route_parameters(TinyMoE())
    assert {n for n, _ in r.muon} == {"w_in", "w_out", "shared.weight"}
    assert {n for n, _ in r.adamw} == {"embed.weight", "norm.weight", "norm.bias",
                                       "router.weight", "shared.bias", "lm_head.weight"}


def test_coverage_check_catches_gaps_and_overlaps():
    model = TinyMoE()
    r = route_parameters(model)
    with pytest.raises(AssertionError, match="missing"):
        check_coverage(model, ParamRouting(muon=r.muon, adamw=r.adamw[1:]))
    with pytest.raises(AssertionError, match="both"):
        check_coverage(model, ParamRouting(muon=r.muon + r.adamw[:1], adamw=r.adamw))


def test_routing_rejects_unknown_shapes():
    model = nn.Module()
    model.conv = nn.Parameter(torch.zeros(2, 2, 2, 2))
    with pytest.raises(ValueError, match="routing rule"):
        route_parameters(model)


# -- the builder, bad input, resume ---------------------------------------------------------


def test_build_optimizer_muon_groups_and_lr_scale():
    model = tiny_transformer(False)
    opt = build_optimizer(model, OptimConfig(name="muon", lr=3e-3))
    muon = [g for g in opt.param_groups if g["use_muon"]]
    adam = [g for g in opt.param_groups if not g["use_muon"]]
    assert len(muon) == 1 and muon[0]["lr"] == 0.02 and muon[0]["adjust_lr"] == "original"
    for g in opt.param_groups:  # the schedule's lr * lr_scale restores every group's own lr
        assert 3e-3 * g["lr_scale"] == pytest.approx(g["lr"])
    assert {g["weight_decay"] for g in adam} == {0.1, 0.0}
    assert all(p.ndim < 2 for g in adam if g["weight_decay"] == 0.0 for p in g["params"])


def test_muon_group_rejects_bad_input():
    vec = nn.Parameter(torch.zeros(4))
    mat = nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="AdamW"):
        MuonWithAdamW([muon_group([vec])])
    with pytest.raises(ValueError, match="adjust_lr"):
        MuonWithAdamW([muon_group([mat], adjust_lr="spectral")])
    with pytest.raises(ValueError, match="ns_dtype"):
        MuonWithAdamW([muon_group([mat], ns_dtype="fp16")])
    with pytest.raises(ValueError, match="ns_steps"):
        MuonWithAdamW([muon_group([mat], ns_steps=0)])
    with pytest.raises(ValueError, match="missing"):
        MuonWithAdamW([{"params": [mat], "use_muon": True, "lr": 0.1}])
    with pytest.raises(ValueError, match="use_muon"):
        MuonWithAdamW([{"params": [mat], "lr": 0.1}])


def test_ns_dtype_auto_follows_the_hardware(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_ns_dtype("auto", cpu) == ("bf16" if cpu_has_fast_bf16() else "fp32")
    # a GPU: bf16 with bf16 tensor cores (Ampere on); a V100 or T4 only emulates bf16
    # matmuls (torch's plain is_bf16_supported() still says yes), where 'auto' took bf16
    for ampere, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, a=ampere: a or including_emulation)
        assert resolve_ns_dtype("auto", torch.device("cuda")) == expected
    assert resolve_ns_dtype("fp32", cpu) == "fp32"
    with pytest.raises(ValueError, match="auto"):
        resolve_ns_dtype("fp16", cpu)


def _train(model, opt, batches):
    losses = []
    for x in batches:
        loss = nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_trains_and_resumes_exactly_through_a_checkpoint(tmp_path):
    cfg = OptimConfig(name="muon", lr=3e-3)
    data = [torch.randint(0, 300, (4, 17), generator=gen(50 + i)) for i in range(2)]
    batches = data * 3  # a repeated pair: the loss must fall fast
    torch.manual_seed(0)
    straight = tiny_transformer(False)
    torch.manual_seed(0)
    resumed = tiny_transformer(False)
    opt = build_optimizer(straight, cfg)
    losses = _train(straight, opt, batches)
    assert losses[-1] < losses[0] - 0.5

    opt2 = build_optimizer(resumed, cfg)
    _train(resumed, opt2, batches[:3])
    ckpt = save_checkpoint(tmp_path, 3, resumed, opt2, {"step": 3}, DistEnv())
    torch.manual_seed(0)
    fresh = tiny_transformer(False)
    opt3 = build_optimizer(fresh, cfg)
    load_checkpoint(ckpt, fresh, opt3)
    assert _train(fresh, opt3, batches[3:]) == losses[3:]
    for a, b in zip(fresh.parameters(), straight.parameters()):
        assert torch.equal(a, b)


def test_resume_takes_the_settings_from_the_config_and_the_state_from_the_checkpoint(tmp_path):
    """A resume with another muon_lr or weight decay must use them, as a fresh run would;
    the moments still come from the checkpoint."""
    torch.manual_seed(0)
    model = tiny_transformer(False)
    opt = build_optimizer(model, OptimConfig(name="muon", lr=3e-3, muon_lr=0.02))
    _train(model, opt, [torch.randint(0, 300, (4, 17), generator=gen(60))])
    ckpt = save_checkpoint(tmp_path, 1, model, opt, {"step": 1}, DistEnv())
    changed = OptimConfig(name="muon", lr=1.5e-3, muon_lr=0.04, weight_decay=0.0,
                          muon_weight_decay=0.0, beta1=0.8, beta2=0.9)
    torch.manual_seed(0)
    fresh = tiny_transformer(False)
    built = build_optimizer(fresh, changed)
    expected = [{k: v for k, v in g.items() if k != "params"} for g in built.param_groups]
    load_checkpoint(ckpt, fresh, built)
    assert [{k: v for k, v in g.items() if k != "params"} for g in built.param_groups] == expected
    muon = next(g for g in built.param_groups if g.get("use_muon"))
    assert muon["lr_scale"] == pytest.approx(0.04 / 1.5e-3) and muon["weight_decay"] == 0.0
    saved = {id(p): p for p in model.parameters()}
    for p_old, p_new in zip(model.parameters(), fresh.parameters()):  # moments restored
        old_state, new_state = opt.state[saved[id(p_old)]], built.state[p_new]
        assert old_state.keys() == new_state.keys()
        for key, value in old_state.items():
            if torch.is_tensor(value):
                assert torch.equal(value, new_state[key])


# -- grouped Newton-Schulz: one batched iteration per shape, same result --------------------


def _per_parameter_step(params, flags):
    """The reference: the optimizer's rule ('original' lr) one matrix at a time."""
    for p, buf in params:
        buf.lerp_(p.grad, 1 - flags["momentum"])
        update = p.grad.lerp(buf, flags["momentum"]) if flags["nesterov"] else buf
        ortho = newton_schulz(update, dtype=flags["dtype"])
        p.data.mul_(1 - flags["lr"] * flags["weight_decay"])
        p.data.add_(ortho, alpha=-flags["lr"] * math.sqrt(max(1, p.shape[-2] / p.shape[-1])))


@pytest.mark.parametrize("ns_dtype,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("nesterov", [True, False])
def test_grouped_path_equals_per_parameter_path(ns_dtype, dtype, nesterov):
    """Shapes as in an MoE model: wide and tall matrices and expert stacks that share an
    oriented shape (32, 64), a square group, and a lone matrix (the 2-D path)."""
    shapes = [(32, 64), (64, 32), (32, 64), (4, 32, 64), (3, 64, 32), (48, 48), (48, 48),
              (40, 24)]
    ours = [nn.Parameter(torch.randn(*s, generator=gen(60 + i))) for i, s in enumerate(shapes)]
    ref = [(nn.Parameter(p.detach().clone()), torch.zeros(p.shape)) for p in ours]
    flags = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": nesterov}
    opt = MuonWithAdamW([muon_group(ours, **flags, ns_dtype=ns_dtype)])
    g = gen(70)
    for _ in range(3):
        for a, (b, _) in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        _per_parameter_step(ref, {**flags, "dtype": dtype})  # adjust_lr 'original'
    for a, (b, _) in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)


def test_orthogonalize_grouped_returns_each_input_orthogonalised_in_its_shape():
    updates = [torch.randn(24, 16, generator=gen(80)), torch.randn(2, 16, 24, generator=gen(81)),
               torch.randn(16, 24, generator=gen(82)) * 1e3, torch.randn(8, 8, generator=gen(83))]
    out = orthogonalize_grouped(updates, 5, (3.4445, -4.7750, 2.0315), 1e-7, torch.float32)
    for u, o in zip(updates, out):
        assert o.shape == u.shape and o.dtype == torch.float32
        torch.testing.assert_close(o, newton_schulz(u, dtype=torch.float32), rtol=0, atol=1e-6)
    # each matrix is normalised on its own: the 1e3-scaled one is not shrunk by the others
    s = torch.linalg.svdvals(out[2].double())
    assert s.min() >= 0.6 and s.max() <= 1.25
    bf = orthogonalize_grouped(updates, 5, (3.4445, -4.7750, 2.0315), 1e-7, torch.bfloat16,
                               out_dtype=torch.float32)
    assert all(o.dtype == torch.float32 for o in bf)
    with pytest.raises(ValueError, match="expert stacks"):
        orthogonalize_grouped([torch.ones(4)], 5, (3.4445, -4.7750, 2.0315), 1e-7,
                              torch.float32)


# -- the update rule over steps with new gradients, against the paper's pseudocode ----------


def paper_newton_schulz(g: torch.Tensor) -> torch.Tensor:
    """NS5 as papers/muon.md writes it, in fp32: per matrix, transposed when tall."""
    if g.ndim == 3:  # an expert stack: each expert's matrix on its own
        return torch.stack([paper_newton_schulz(m) for m in g])
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def paper_muon_step(w: torch.Tensor, buf: torch.Tensor, g: torch.Tensor, lr: float, wd: float,
                    beta: float, nesterov: bool) -> None:
    """buf = beta buf + (1 - beta) g; u = (1 - beta) g + beta buf (Nesterov) or buf;
    W *= 1 - lr wd; W -= lr sqrt(max(1, rows / cols)) NS5(u)."""
    buf.mul_(beta).add_((1 - beta) * g)
    u = (1 - beta) * g + beta * buf if nesterov else buf
    w.mul_(1 - lr * wd)
    w.sub_(lr * math.sqrt(max(1, w.shape[-2] / w.shape[-1])) * paper_newton_schulz(u))


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("beta", [0.95, 0.8])
def test_steps_with_new_gradients_follow_the_papers_update(nesterov, beta):
    """Four steps, a new gradient each (so momentum and Nesterov's look-ahead change the
    direction, which one repeated gradient cannot show), with weight decay, on a tall and a
    wide matrix and an expert stack: each step's change equals the pseudocode's."""
    shapes = [(48, 16), (16, 40), (3, 8, 24)]
    ours = [nn.Parameter(torch.randn(*s, generator=gen(90 + i))) for i, s in enumerate(shapes)]
    ref = [p.detach().clone() for p in ours]
    bufs = [torch.zeros(s) for s in shapes]
    lr, wd = 0.05, 0.3
    opt = MuonWithAdamW([muon_group(ours, lr=lr, weight_decay=wd, momentum=beta,
                                    nesterov=nesterov)])
    g = gen(95)
    for _ in range(4):
        grads = [torch.randn(s, generator=g) * (1 + 3 * torch.rand(1, generator=g))
                 for s in shapes]
        for p, grad in zip(ours, grads):
            p.grad = grad.clone()
        opt.step()
        for w, buf, grad in zip(ref, bufs, grads):
            paper_muon_step(w, buf, grad, lr, wd, beta, nesterov)
        for p, w in zip(ours, ref):
            torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-6)  # measured 3e-7
