"""A checkpoint saved in each model and optimizer configuration resumes: rank 0's check of
optimizer.pt before it is sent (`_refuse_other_state`: a moment missing or of another shape)
must not refuse a legitimate one (tied embeddings, experts that got no tokens, Muon's
momentum, a bf16 resume of an fp32 run, optimizer settings changed on the resume)."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from kiln.train.trainer import Trainer

MOE = ["model.n_experts=8", "model.n_dense_layers=1", "model.top_k=2", "model.n_shared=1",
       "model.expert_hidden=16"]
CONFIGS = {
    "tied embeddings, AdamW": ([], []),
    "untied, Muon": (["model.tie_embeddings=false", "optim.name=muon"], []),
    "MoE, Muon (experts without tokens)": ([*MOE, "optim.name=muon"], []),
    "MoE, AdamW": (MOE, []),
    "fp32 run resumed in bf16": ([], ["train.precision=bf16"]),
    "optimizer settings changed": ([], ["optim.weight_decay=0", "optim.beta1=0.5",
                                        "optim.lr=0.0001"]),
    "Muon settings changed": (["optim.name=muon"], ["optim.muon_weight_decay=0",
                                                    "optim.weight_decay=0"]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_checkpoint_of_each_configuration_resumes(tiny_run, name):
    first, then = CONFIGS[name]
    base = ["train.eval_every=0", "train.checkpoint_every=2"]
    Trainer(tiny_config(tiny_run, *base, *first, "train.steps=2")).fit()
    resumed = Trainer(tiny_config(tiny_run, *base, *first, *then, "train.steps=3"))
    assert resumed.step == 2 and resumed.optimizer.state  # the moments came back
    assert len(resumed.fit()) == 1
    assert (tiny_run / "checkpoints" / "step_00000003" / "trainer.pt").is_file()


def test_a_top_k_1_moe_run_of_before_its_refusal_resumes(tiny_run, monkeypatch):
    """A run made before top_k = 1 was refused for a new model goes on as it was: its router
    gets no gradient (a lone expert's gate is constant), so AdamW keeps no moments for it."""
    moe = [*MOE, "model.top_k=1", "train.eval_every=0", "train.checkpoint_every=2"]
    monkeypatch.setattr("kiln.train.train_setup.design_problems", lambda cfg: [])
    Trainer(tiny_config(tiny_run, *moe, "train.steps=2")).fit()
    monkeypatch.undo()
    resumed = Trainer(tiny_config(tiny_run, *moe, "train.steps=3"))
    assert resumed.step == 2 and len(resumed.fit()) == 1
