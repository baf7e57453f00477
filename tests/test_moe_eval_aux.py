"""Eval and generation skip the MoE auxiliary losses (nothing trains on them there) with
the same outputs, and the routing counts still follow every forward."""

from __future__ import annotations

import pytest
import torch

import kiln.model.moe as moe_module
from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.model.moe import MoE
from kiln.model.sampling import generate


@pytest.fixture
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                      max_seq_len=48, n_experts=4, top_k=2, n_dense_layers=1,
                      seq_aux_coef=1e-2, z_loss_coef=1e-3, init_std=0.3)
    return Transformer(cfg)


@pytest.fixture
def aux_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("sequence_aux_loss", "router_z_loss"):
        real = getattr(moe_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(moe_module, name, spy)
    return calls


def test_eval_and_generate_skip_the_aux_losses_with_the_same_outputs(model, aux_calls,
                                                                     monkeypatch):
    tokens = torch.randint(0, 64, (2, 33))
    model.eval()

    def run() -> tuple[torch.Tensor, list[int], list[int], list[torch.Tensor]]:
        with torch.inference_mode():  # as `kiln eval`
            loss = model(tokens[:, :-1], targets=tokens[:, 1:])
        counts = [m.last_counts.clone() for m in model.moe_layers()]
        greedy = generate(model, [1, 2, 3], 12, temperature=0.0)
        sampled = generate(model, [1, 2, 3], 12, temperature=1.0,
                           generator=torch.Generator().manual_seed(5))
        return loss, greedy, sampled, counts

    loss, greedy, sampled, counts = run()
    assert aux_calls == []  # neither loss computed in eval or generation
    assert all(m.aux_loss is None for m in model.moe_layers()) and model.aux_loss() is None
    assert [int(c.sum()) for c in counts] == [2 * 32 * 2] * 2  # routing counted all the same
    monkeypatch.setattr(MoE, "aux_wanted", lambda self: True)  # the old behaviour
    old_loss, old_greedy, old_sampled, old_counts = run()
    assert aux_calls  # (the spies do see them when computed)
    assert torch.equal(loss, old_loss) and greedy == old_greedy and sampled == old_sampled
    assert all(torch.equal(a, b) for a, b in zip(counts, old_counts, strict=True))


def test_training_forwards_still_compute_them(model, aux_calls):
    tokens = torch.randint(0, 64, (2, 17))
    model.train()
    loss = model(tokens[:, :-1], targets=tokens[:, 1:]) + model.aux_loss()
    assert aux_calls.count("sequence_aux_loss") == 2 and aux_calls.count("router_z_loss") == 2
    assert model.aux_loss().requires_grad
    loss.backward()
    assert all(int(m.balancer.pending_counts.sum()) == 2 * 16 * 2 for m in model.moe_layers())
    model.eval()  # eval mode with gradients (a probe that backpropagates) computes them too
    model(tokens[:, :-1], targets=tokens[:, 1:])
    assert model.aux_loss() is not None and len(aux_calls) == 8
