"""Sigmoid-routed MoE layer and its loss-free bias balancing (Trinity / DeepSeek-V3)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mp_helpers import run_function_on_ranks

from kiln.model.balancing import (
    ExpertBiasBalancer,
    max_violation,
    sign_rule_delta,
    smebu_step,
)
from kiln.model.moe import MoE, route, router_z_loss, select_experts, sequence_aux_loss

BACKENDS = ["grouped_mm", "padded_bmm"]


def make_moe(seed: int = 0, **kw) -> MoE:
    torch.manual_seed(seed)
    args = dict(dim=16, expert_hidden=8, n_experts=6, top_k=2, n_shared=1, route_scale=2.5,
                router_init_std=0.3, init_std=0.2)
    return MoE(**{**args, **kw})


# ---------------------------------------------------------------- router


def test_gates_sum_to_route_scale():
    torch.manual_seed(0)
    logits = torch.randn(50, 8) * 3
    bias = torch.randn(8)
    _, idx, gates = route(logits, bias, top_k=3, route_scale=2.826)
    assert idx.shape == gates.shape == (50, 3)
    torch.testing.assert_close(gates.sum(-1), torch.full((50,), 2.826), rtol=0, atol=1e-6)
    assert (gates > 0).all()


def test_large_bias_selects_expert_but_gate_uses_unbiased_score():
    torch.manual_seed(1)
    logits = torch.randn(40, 8)
    j, scale = 5, 2.0
    bias = torch.zeros(8)
    bias[j] = 10.0
    _, idx, gates = route(logits, bias, top_k=2, route_scale=scale)
    assert (idx == j).any(-1).all(), "the biased expert must be selected by every token"
    s = torch.sigmoid(logits)
    for t in range(40):
        chosen = idx[t].tolist()
        k = chosen.index(j)
        want = scale * s[t, j] / sum(s[t, i] for i in chosen)  # unbiased normalised score
        assert abs(float(gates[t, k]) - float(want)) < 1e-6
        assert float(gates[t, k]) < scale  # the biased score (~10.5) would give ~scale


def test_layer_bias_routes_every_token_and_counts_are_recorded():
    moe = make_moe()
    moe.balancer.bias[3] = 10.0
    x = torch.randn(2, 7, 16)
    moe(x)
    assert int(moe.last_counts[3]) == 14
    assert int(moe.last_counts.sum()) == 14 * 2  # no token dropped
    assert torch.equal(moe.balancer.pending_counts, moe.last_counts)
    counts = moe.update_bias()  # what the trainer logs the step's expert load from
    assert torch.equal(counts, moe.last_counts)
    assert abs(max_violation(counts) - (14 - 14 * 2 / 6) / (14 * 2 / 6)) < 1e-12


# ---------------------------------------------------------------- layer vs slow reference


def reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Loop over experts; every weight read straight from the module."""
    x2 = x.reshape(-1, x.shape[-1])
    s = torch.sigmoid(x2 @ moe.router.weight.T)
    idx = torch.topk(s.detach() + moe.balancer.bias, moe.top_k, dim=-1).indices
    picked = s.gather(1, idx)
    gates = moe.route_scale * picked / picked.sum(-1, keepdim=True)
    e = moe.experts
    out = torch.zeros_like(x2)
    for i in range(moe.n_experts):
        rows, slot = (idx == i).nonzero(as_tuple=True)
        h = F.silu(x2[rows] @ e.w_gate[i].T) * (x2[rows] @ e.w_up[i].T)
        out = out.index_add(0, rows, gates[rows, slot, None] * (h @ e.w_down[i].T))
    if moe.shared is not None:
        sh = moe.shared
        out = out + (F.silu(x2 @ sh.w_gate.weight.T) * (x2 @ sh.w_up.weight.T)) @ sh.w_down.weight.T
    return out.reshape(x.shape)


@pytest.mark.parametrize("skewed", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_and_backward_match_reference_loop(backend, skewed):
    moe = make_moe(backend=backend)
    if skewed:  # experts 0 and 1 take every token: capacity = all tokens, none dropped
        moe.balancer.bias[:2] = 100.0
    ref = make_moe(backend=backend)
    ref.load_state_dict(moe.state_dict())
    x = torch.randn(3, 11, 16)
    r = torch.randn(3, 11, 16)
    y = moe(x)
    y_ref = reference_moe(ref, x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5)
    (y * r).sum().backward()
    (y_ref * r).sum().backward()
    grads = dict(ref.named_parameters())
    assert len(grads) == 7  # router, 3 expert stacks, 3 shared-expert weights
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=1e-5, msg=name)
    if skewed:
        assert moe.last_counts[:2].tolist() == [33, 33] and int(moe.last_counts.sum()) == 66



@pytest.mark.parametrize("n_experts,top_k", [(1, 1), (4, 4)], ids=["one-expert", "top-k=all"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_expert_chosen_matches_the_reference(backend, n_experts, top_k):
    """The edges of routing: one expert (its gate always route_scale) and top_k = n_experts
    (every token through every expert, each gate its score over the sum of all)."""
    moe = make_moe(backend=backend, n_experts=n_experts, top_k=top_k)
    x = torch.randn(2, 9, 16)
    y = moe(x)
    torch.testing.assert_close(y, reference_moe(moe, x), rtol=0, atol=1e-5)
    assert moe.last_counts.tolist() == [18] * n_experts
    y.sum().backward()
    if top_k > 1:  # gates that differ between experts: the router learns through them
        assert moe.router.weight.grad.abs().sum() > 0

def test_shared_expert_is_always_applied():
    moe = make_moe()
    with torch.no_grad():
        moe.experts.w_down.zero_()
    x = torch.randn(2, 5, 16)
    y = moe(x)
    assert y.abs().sum() > 0
    torch.testing.assert_close(y, moe.shared(x), rtol=0, atol=1e-6)
    no_shared = make_moe(n_shared=0)
    with torch.no_grad():
        no_shared.experts.w_down.zero_()
    assert no_shared.shared is None and no_shared(x).abs().sum() == 0


def test_bf16_autocast_close_to_fp32():
    moe = make_moe(seq_aux_coef=1e-2, z_loss_coef=1e-3)
    x = torch.randn(2, 9, 16)
    y32 = moe(x)
    counts32, aux32 = moe.last_counts.clone(), moe.aux_loss.detach().clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = moe(x)
    assert y16.dtype == torch.float32  # output in the residual stream's dtype
    torch.testing.assert_close(y16, y32, rtol=0.05, atol=0.05)
    assert not torch.equal(y16, y32)  # the experts did run in bf16
    # the router stays in fp32 under autocast: the same picks and, to the bit, the same aux
    assert torch.equal(moe.last_counts, counts32)
    assert moe.aux_loss.dtype == torch.float32
    torch.testing.assert_close(moe.aux_loss.detach(), aux32, rtol=0, atol=0)


def test_bad_input_is_rejected():
    moe = make_moe()
    with pytest.raises(ValueError, match="expects"):
        moe(torch.randn(4, 16))
    with pytest.raises(ValueError, match="balance rule"):
        make_moe(balance="loss")
    with pytest.raises(ValueError, match="top_k"):
        make_moe(top_k=7)
    with pytest.raises(ValueError, match="backend"):
        make_moe(backend="cuda_magic")


# ---------------------------------------------------------------- auxiliary losses


def test_sequence_aux_and_z_loss_match_hand_computation():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 1.5, -2.0]]])  # B=1, T=2, E=3
    # K=2: the top two scores are experts {0, 1} at both positions; expert 2 never counts
    s = [[1 / (1 + math.exp(-v)) for v in row] for row in logits[0].tolist()]
    p = [sum(s[t][i] / sum(s[t]) for t in range(2)) / 2 for i in range(3)]
    f = [3 / (2 * 2) * c for c in (2, 2, 0)]
    want_aux = sum(fi * pi for fi, pi in zip(f, p))
    got_aux = sequence_aux_loss(torch.sigmoid(logits), 2)
    assert abs(float(got_aux) - want_aux) < 1e-6
    want_z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits[0].tolist()) / 2
    assert abs(float(router_z_loss(logits.reshape(2, 3))) - want_z) < 1e-5

    moe = make_moe(seq_aux_coef=1e-2, z_loss_coef=1e-3, n_experts=3)
    x = torch.randn(2, 4, 16)
    moe(x)
    lg = x.reshape(8, 16) @ moe.router.weight.T
    want = 1e-2 * sequence_aux_loss(torch.sigmoid(lg).reshape(2, 4, 3), 2) + 1e-3 * router_z_loss(lg)
    assert moe.aux_loss.requires_grad
    torch.testing.assert_close(moe.aux_loss, want, rtol=1e-6, atol=0)


def test_balanced_routing_gives_unit_seq_aux_weights():
    # with perfectly uniform selection every f_i = 1, so the loss is sum_i P_i = 1
    top = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])  # each expert in the top 2 twice
    scores = (0.1 * torch.rand(2, 4, 4)).scatter_add(-1, top.expand(2, 4, 2), torch.full((2, 4, 2), 0.5))
    assert abs(float(sequence_aux_loss(scores, 2)) - 1.0) < 1e-6


def test_seq_aux_loss_counts_the_routers_own_top_k_not_the_biased_pick():
    # DeepSeek-V3 eq. 18: f_i counts the top-K of the unbiased scores. A bias that sends
    # every token to expert 2 changes which experts run, not the loss.
    moe = make_moe(seq_aux_coef=1.0, n_experts=4)
    x = torch.randn(2, 6, 16)
    moe(x)
    plain = moe.aux_loss.detach().clone()
    moe.balancer.bias[2] = 10.0
    moe(x)
    assert int(moe.last_counts[2]) == 12  # the bias did change the pick
    torch.testing.assert_close(moe.aux_loss, plain, rtol=0, atol=0)
    lg = x.reshape(12, 16) @ moe.router.weight.T
    torch.testing.assert_close(plain, sequence_aux_loss(torch.sigmoid(lg).reshape(2, 6, 4), 2))


# ---------------------------------------------------------------- balancing rules


def test_sign_rule_one_step():
    delta = sign_rule_delta(torch.tensor([5, 1, 1, 1]), gamma=0.1)
    torch.testing.assert_close(delta, torch.tensor([-0.15, 0.05, 0.05, 0.05], dtype=torch.float64))


def test_smebu_one_step_hand_computed():
    lam, beta, kappa = 5e-4, 0.5, 2.0
    counts = torch.tensor([3, 1, 0, 4])
    m0 = torch.tensor([1e-4, -2e-4, 0.0, 1e-4], dtype=torch.float64)
    u = [lam * math.tanh(kappa * (2 - n) / 2) for n in (3, 1, 0, 4)]
    u = [ui - sum(u) / 4 for ui in u]
    want = [beta * a + (1 - beta) * c for a, c in zip(m0.tolist(), u)]
    delta, m = smebu_step(counts, m0, lam, beta, kappa)
    torch.testing.assert_close(m, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(delta, m)



def test_smebu_over_steps_of_real_routing_matches_a_loop_reference():
    """Six optimizer steps of two micro-batches each through the layer: bias and momentum
    follow the digest's rule, written out per expert in fp64 from the counts each step
    routed (which the moving bias changes), to fp32 rounding."""
    lam, beta, kappa = 0.05, 0.5, 2.0
    moe = make_moe(n_experts=6, balance="smebu", balance_rate=lam)
    g = torch.Generator().manual_seed(1)
    b, m, seen = [0.0] * 6, [0.0] * 6, []
    for _ in range(6):
        for _ in range(2):
            moe(torch.randn(2, 8, 16, generator=g) + 0.5)
        n = moe.update_bias().tolist()
        seen.append(n)
        nbar = sum(n) / 6
        u = [lam * math.tanh(kappa * (nbar - ni) / nbar) for ni in n]
        m = [beta * mi + (1 - beta) * (ui - sum(u) / 6) for mi, ui in zip(m, u)]
        b = [bi + mi for bi, mi in zip(b, m)]
    assert all(sum(n) == 2 * 2 * 8 * 2 for n in seen) and len({tuple(n) for n in seen}) > 1
    bal = moe.balancer
    torch.testing.assert_close(bal.momentum.double(), torch.tensor(m, dtype=torch.float64),
                               rtol=0, atol=1e-8)
    torch.testing.assert_close(bal.bias.double(), torch.tensor(b, dtype=torch.float64),
                               rtol=0, atol=1e-8)
    assert max(map(abs, b)) > 0.05  # the bias moved by several steps' worth

def test_smebu_keeps_bias_centred_and_momentum_bounded():
    lam = 5e-4
    g = torch.Generator().manual_seed(0)
    b = torch.zeros(16, dtype=torch.float64)
    m = torch.zeros(16, dtype=torch.float64)
    bal = ExpertBiasBalancer(16, "smebu", lam)
    for _ in range(2000):
        counts = torch.randint(0, 1000, (16,), generator=g) * torch.randint(0, 2, (16,), generator=g)
        delta, m = smebu_step(counts, m, lam, 0.5, 2.0)
        b += delta
        assert m.abs().max() <= 2 * lam
        bal.record(counts)
        bal.update()
        assert bal.momentum.abs().max() <= 2 * lam * (1 + 1e-6)
    assert abs(float(b.sum())) < 1e-12
    assert float(b.abs().max()) > 1e-3  # the bias did move
    assert abs(float(bal.bias.sum())) < 1e-7 * 16 and bal.bias.dtype == torch.float32


def test_counts_accumulate_over_micro_batches_until_update():
    moe = make_moe(balance="sign", balance_rate=0.01)
    whole = make_moe(balance="sign", balance_rate=0.01)
    x = torch.randn(4, 6, 16)
    moe(x[:2])
    moe(x[2:])
    whole(x)
    assert torch.equal(moe.balancer.pending_counts, whole.balancer.pending_counts)
    moe.eval()
    moe(x)  # evaluation passes do not count
    assert torch.equal(moe.balancer.pending_counts, whole.balancer.pending_counts)
    counts = moe.update_bias()
    whole.update_bias()
    assert int(counts.sum()) == 4 * 6 * 2 and int(moe.balancer.pending_counts.sum()) == 0
    assert moe.balancer.bias.abs().sum() > 0
    torch.testing.assert_close(moe.balancer.bias, whole.balancer.bias, rtol=0, atol=0)
    assert abs(float(moe.balancer.bias.sum())) < 1e-7  # re-centred


def simulate_balancing(
    rules_rates: list[tuple[str, float]], steps: int = 1500, skew_scale: float = 2.5
) -> torch.Tensor:
    """MaxVio per step (steps, runs) of a fixed skewed sigmoid router (16 experts, top-2,
    4096 tokens/step, fresh logit noise each step), all runs batched and sharing noise."""
    e, k, n, runs = 16, 2, 4096, len(rules_rates)
    g = torch.Generator().manual_seed(0)
    skew = skew_scale * torch.linspace(1, 0, e) ** 2
    b = torch.zeros(runs, e, dtype=torch.float64)
    m = torch.zeros(runs, e, dtype=torch.float64)
    sign = torch.tensor([r == "sign" for r, _ in rules_rates]).unsqueeze(-1)
    rates = torch.tensor([rate for _, rate in rules_rates], dtype=torch.float64).unsqueeze(-1)
    offsets = (torch.arange(runs) * e).view(runs, 1, 1)
    history = torch.empty(steps, runs)
    for step in range(steps):
        scores = torch.sigmoid(skew + torch.randn(n, e, generator=g))
        idx = select_experts(scores.expand(runs, n, e), b.float().unsqueeze(1), k)
        counts = torch.bincount((idx + offsets).reshape(-1), minlength=runs * e).view(runs, e)
        nbar = counts.double().mean(-1)
        history[step] = ((counts.double().amax(-1) - nbar) / nbar).float()
        d_smebu, m_new = smebu_step(counts, m, rates, 0.5, 2.0)
        m = torch.where(sign, m, m_new)
        b = b + torch.where(sign, sign_rule_delta(counts, 1.0) * rates, d_smebu)
        b = b - b.mean(-1, keepdim=True)
    return history


def test_simulation_both_rules_balance_and_smebu_is_steadier_at_large_steps():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: threads only add contention
    try:
        hist = simulate_balancing([("sign", 1e-3), ("smebu", 1e-3), ("sign", 2e-2), ("smebu", 2e-2)])
    finally:
        torch.set_num_threads(threads)
    start, final = hist[0], hist[-200:].mean(0)
    assert (start > 3.0).all(), start
    assert final[0] < 0.15 and final[1] < 0.15, final  # small step: both balance
    assert final[3] < 0.15, final  # SMEBU at a large step still balances ...
    assert final[2] > 2 * final[3], final  # ... while the sign rule oscillates


def test_max_violation():
    assert max_violation(torch.tensor([4, 4, 4, 4])) == 0.0
    assert max_violation(torch.tensor([9, 3, 0, 0])) == 2.0


# ---------------------------------------------------------------- across ranks


def _updates_after_three_steps(rank: int, world: int, rule: str) -> dict:
    """Bias and momentum after 3 steps, this rank seeing its 1/world share of each batch
    and summing the counts over ranks with the reduction the trainer passes."""
    from kiln.parallel.distributed import DistEnv, all_reduce_sum

    env = DistEnv(rank=rank, world_size=world)
    moe = make_moe(balance=rule, balance_rate=0.05)
    torch.manual_seed(123)
    share = 4 // world
    for x in [torch.randn(4, 8, 16) for _ in range(3)]:
        moe(x[share * rank: share * (rank + 1)])
        moe.update_bias(lambda c: all_reduce_sum(c, env))
    return {"bias": moe.balancer.bias.clone(), "momentum": moe.balancer.momentum.clone()}


def _both_rules(rank: int, world: int) -> dict:
    return {rule: _updates_after_three_steps(rank, world, rule) for rule in ("smebu", "sign")}


def test_counts_all_reduced_over_two_ranks_match_one_rank():
    ranks = run_function_on_ranks(_both_rules, 2, timeout=120)
    for rule in ("smebu", "sign"):
        one = _updates_after_three_steps(0, 1, rule)  # no process group here: the whole batch
        assert one["bias"].abs().sum() > 0
        for r in ranks:
            torch.testing.assert_close(r[rule]["bias"], one["bias"], rtol=0, atol=1e-7)
            torch.testing.assert_close(r[rule]["momentum"], one["momentum"], rtol=0, atol=1e-7)


def test_gates_of_underflowing_scores_are_zero_not_nan():
    """A diverged router whose K picked sigmoid scores all underflow to 0 in fp32 gives
    gates of 0 (as Hugging Face's afmoe router), not nan that would poison the backward."""
    from kiln.model.moe import route

    logits = torch.tensor([[-110.0, -120.0, -130.0, -140.0], [0.0, 1.0, 2.0, 3.0]])
    _, idx, gates = route(logits, torch.zeros(4), top_k=2, route_scale=1.0)
    assert torch.equal(gates[0], torch.zeros(2))
    assert gates[1].sum().item() == pytest.approx(1.0, rel=1e-6)


# ---------------------------------------------------------------- training step


def _one_step_with_aux(run_dir, micro_batch: int) -> tuple[dict, dict, list]:
    """One train_step of a tiny MoE model with both aux losses on: the gradients the
    optimizer saw, the step's record and the balancing biases after it."""
    from conftest import tiny_config

    from kiln.train.trainer import Trainer

    cfg = tiny_config(run_dir, "model.n_experts=4", "model.top_k=2", "model.expert_hidden=32",
                      "model.seq_aux_coef=0.3", "model.z_loss_coef=0.03", "optim.grad_clip=0",
                      "train.global_batch=8", f"train.micro_batch={micro_batch}")
    trainer = Trainer(cfg, resume=False)
    assert trainer.accum_steps == 8 // micro_batch
    grads, step = {}, trainer.optimizer.step

    def recording_step(*args, **kw):
        grads.update({n: p.grad.clone() for n, p in trainer.raw_model.named_parameters()
                      if p.grad is not None})
        return step(*args, **kw)

    trainer.optimizer.step = recording_step
    record = trainer.train_step()
    biases = [m.balancer.bias.clone() for m in trainer.raw_model.moe_layers()]
    return grads, record, biases


def test_the_steps_aux_loss_is_logged_as_the_model_computes_it(tiny_run):
    """The balance and z-losses added to the objective were never logged (a divergence that
    starts there was named by the LM loss alone): the step's record has `aux_loss`, its
    mean over micro-batches, equal to the model's own on the step's batch."""
    from conftest import tiny_config

    from kiln.report.metrics_io import read_metrics
    from kiln.train.precision import autocast
    from kiln.train.trainer import Trainer

    _, r1, _ = _one_step_with_aux(tiny_run, micro_batch=8)
    _, r2, _ = _one_step_with_aux(tiny_run, micro_batch=4)
    cfg = tiny_config(tiny_run, "model.n_experts=4", "model.top_k=2", "model.expert_hidden=32",
                      "model.seq_aux_coef=0.3", "model.z_loss_coef=0.03", "optim.grad_clip=0",
                      "train.global_batch=8", "train.micro_batch=8")
    trainer = Trainer(cfg, resume=False)
    batch = trainer.loader.next_batch()
    with autocast(trainer.device, trainer.precision):
        trainer.model(batch[:, :-1], targets=batch[:, 1:])
    reference = trainer.raw_model.aux_loss().item()
    assert reference > 0
    assert r1["aux_loss"] == pytest.approx(reference, rel=1e-5)
    assert r2["aux_loss"] == pytest.approx(reference, rel=1e-2)  # per-sequence: ~equal
    Trainer(tiny_config(tiny_run, "model.n_experts=4", "model.top_k=2",
                        "model.expert_hidden=32", "model.z_loss_coef=0.03", "train.steps=2",
                        "train.log_every=1"), resume=False).fit()
    logged = [r for r in read_metrics(tiny_run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in logged] == [1, 2] and all(r["aux_loss"] > 0 for r in logged)


def test_a_moe_run_without_aux_losses_logs_no_aux_loss(tiny_run):
    """Neither seq_aux_coef nor z_loss_coef set: nothing is added to the objective, and the
    README says the records carry no `aux_loss`; they carried `aux_loss: 0.0` every step."""
    from conftest import tiny_config

    from kiln.report.metrics_io import read_metrics
    from kiln.train.trainer import Trainer

    trainer = Trainer(tiny_config(tiny_run, "model.n_experts=4", "model.top_k=2",
                                  "model.expert_hidden=32", "train.steps=2"), resume=False)
    trainer.fit()
    assert trainer.raw_model.aux_loss() is None
    logged = [r for r in read_metrics(tiny_run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in logged] == [1, 2]
    assert all("aux_loss" not in r and "moe_max_vio" in r for r in logged)


def test_aux_losses_are_averaged_over_micro_batches_like_the_loss(tiny_run):
    """Gradient accumulation must not change what a step computes: the LM loss, the per-
    sequence balance loss and the per-token z-loss are all means, so 2 micro-batches of 4
    sequences give the gradients of one batch of 8 when each micro-batch's loss + aux is
    divided by 2. (Routing is per token and the balancing bias moves only after the step,
    from counts summed over the micro-batches, so nothing else differs.) An aux loss added
    once per micro-batch would double the router's aux gradient."""
    g1, r1, b1 = _one_step_with_aux(tiny_run, micro_batch=8)
    g2, r2, b2 = _one_step_with_aux(tiny_run, micro_batch=4)
    assert any("router" in n for n in g1) and g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-6, msg=name)
    assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-5)
    assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-4)
    assert r1["moe_load"] == r2["moe_load"]  # the same routing, counted once per step
    for a, b in zip(b1, b2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_grouped_mm_probe_answers_the_same_when_first_asked_without_gradients(context):
    """eval and generate may ask first, under no_grad: a backward-less probe failed there
    and its cached 'no' sent training to the slower padded path for the whole process."""
    from kiln.model.moe import grouped_mm_works

    grouped_mm_works.cache_clear()
    expected = grouped_mm_works("cpu", torch.float32)
    grouped_mm_works.cache_clear()
    with context():
        assert grouped_mm_works("cpu", torch.float32) == expected
    grouped_mm_works.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_probe_draws_nothing_from_the_global_generator(dtype):
    """The probe runs at the first MoE forward: its random inputs moved the global CPU
    generator there, a step's place apart in a resumed and an uninterrupted run."""
    from kiln.model.moe import grouped_mm_works

    if not hasattr(torch.nn.functional, "grouped_mm"):
        pytest.skip("no grouped_mm in this torch")
    grouped_mm_works.cache_clear()
    state = torch.get_rng_state()
    assert grouped_mm_works("cpu", dtype)  # torch 2.13 runs it on the CPU
    assert torch.equal(torch.get_rng_state(), state)
    grouped_mm_works.cache_clear()


@pytest.mark.parametrize("dtype, hidden", [(torch.float32, 30), (torch.bfloat16, 36)])
def test_expert_widths_grouped_mm_cannot_take_fall_back(dtype, hidden):
    """grouped_mm needs 16-byte row strides; `auto` must not hand it an expert width that
    is not a multiple of 4 (fp32) or 8 (bf16), however the 16 x 16 probe answered."""
    moe = make_moe(expert_hidden=hidden)
    ref = make_moe(expert_hidden=hidden, backend="padded_bmm")
    ref.load_state_dict(moe.state_dict())
    x = torch.randn(2, 9, 16, dtype=dtype)
    assert moe.experts.resolved_backend(x) == "padded_bmm"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        y, y_ref = moe(x.float()), ref(x.float())
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
