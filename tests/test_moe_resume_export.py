"""A Trinity MoE run trained with Muon, stopped, resumed and exported: the resume continues
exactly (weights, balancing bias and SMEBU momentum), and the afmoe export computes the
resumed model's logits."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub import

import shutil  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import tiny_config  # noqa: E402

from kiln.cli import main  # noqa: E402
from kiln.train.checkpoint_dirs import latest_checkpoint  # noqa: E402
from kiln.train.trained_run import load_trained_model  # noqa: E402

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.afmoe")

MOE = ["model.n_layers=3", "model.local_per_global=1", "model.sliding_window=8",
       "model.global_rope=false", "model.qk_norm=true", "model.attn_gate=true",
       "model.sandwich_norm=true", "model.embed_scale=true", "model.tie_embeddings=false",
       "model.n_experts=4", "model.n_dense_layers=1", "model.top_k=2", "model.n_shared=1",
       "model.expert_hidden=16", "model.balance=smebu", "model.balance_rate=0.05",
       "model.seq_aux_coef=0.01", "model.z_loss_coef=0.001", "optim.name=muon",
       "optim.muon_ns_dtype=fp32", "train.steps=4", "train.checkpoint_every=2",
       "train.eval_every=0", "schedule.warmup_steps=1"]


def _args(*extra: str) -> list[str]:
    return [a for o in [*MOE, *extra] for a in ("--set", o)]


def test_moe_run_resumed_then_exported_matches_the_straight_run(tiny_run, tmp_path):
    straight = tmp_path / "straight"
    assert main(["train", str(tiny_run), *_args()]) == 0
    shutil.copytree(tiny_run, straight)
    # stop the run after step 2: its later checkpoint gone, a resume trains steps 3 and 4 again
    shutil.rmtree(tiny_run / "checkpoints" / "step_00000004")
    (tiny_run / "checkpoints" / "latest").unlink()
    assert main(["train", str(tiny_run), *_args()]) == 0

    models = []
    for run in (straight, tiny_run):
        cfg = tiny_config(run, *MOE)
        model, ckpt = load_trained_model(cfg)
        assert ckpt == latest_checkpoint(run / "checkpoints") and ckpt.name.endswith("4")
        models.append(model)
    a, b = models
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    biases = [m.balancer.bias for m in b.moe_layers()]
    assert biases and all(bias.abs().max() > 0 for bias in biases)

    assert main(["export", str(tiny_run), *_args()]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_run / "export").eval()
    assert type(hf).__name__ == "AfmoeForCausalLM"
    x = torch.randint(0, b.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = b(x), hf(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    for bias, layer in zip(biases, [m for m in hf.model.layers if hasattr(m.mlp, "expert_bias")]):
        torch.testing.assert_close(layer.mlp.expert_bias, bias, rtol=0, atol=0)
