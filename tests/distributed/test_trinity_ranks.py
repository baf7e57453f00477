"""A Trinity + MoE + Muon model on 2 gloo ranks (FSDP2 and DDP) gives the 1-rank losses.

Covers what only ranks exercise: expert-bias balancing with counts all-reduced across ranks
(every rank must apply the same SMEBU step), the sequence-wise balance and z-losses under
data parallelism, Muon on sharded 2-D weights and expert stacks, and the sliding-window /
NoPE attention mix. The bias moves fast enough here (balance_rate 1e-2) that a per-rank
update would change routing, and with it the losses, within the 12 steps.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import tiny_config
from launch import run_ranks

from kiln.report import read_metrics
from kiln.train.trainer import Trainer

TRINITY = ["model.local_per_global=1", "model.sliding_window=8", "model.global_rope=false",
           "model.qk_norm=true", "model.attn_gate=true", "model.sandwich_norm=true",
           "model.embed_scale=true", "model.tie_embeddings=false", "model.n_experts=4",
           "model.n_dense_layers=1", "model.top_k=2", "model.n_shared=1",
           "model.expert_hidden=16", "model.route_scale=1.4142", "model.balance=smebu",
           "model.balance_rate=1e-2", "model.seq_aux_coef=1e-2", "model.z_loss_coef=1e-4",
           "optim.name=muon", "optim.muon_ns_dtype=fp32"]


def train_records(run_dir) -> list[dict]:
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl", newest_only=())  # every moe_load
            if r["kind"] == "train"]
    return sorted(recs, key=lambda r: r["step"])


@pytest.fixture
def single_rank(tiny_run, tmp_path):
    ref = tmp_path / "single"
    shutil.copytree(tiny_run, ref)
    Trainer(tiny_config(ref, *TRINITY)).fit()
    return train_records(ref)


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_trinity_two_ranks_match_one_rank(tiny_run, single_rank, mode):
    sets = [a for o in [*TRINITY, f"train.parallel={mode}"] for a in ("--set", o)]
    run_ranks(["train", str(tiny_run), *sets], world_size=2, timeout=300)
    two = train_records(tiny_run)
    assert len(two) == len(single_rank) == 12
    for a, b in zip(two, single_rank):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)
        assert a["moe_max_vio"] == pytest.approx(b["moe_max_vio"], abs=1e-9)  # global counts
        for la, lb in zip(a["moe_load"], b["moe_load"]):
            assert la == pytest.approx(lb, abs=1e-12)
    assert '"world_size": 2' in (tiny_run / "model.json").read_text()
