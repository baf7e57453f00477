"""recipes/trinity-tiny.toml and its dense baseline: options, equal active parameters, training."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from kiln.config import load_config
from kiln.export.hf_afmoe import afmoe_incompatibilities
from kiln.export.hf_llama import llama_incompatibilities
from kiln.model import Transformer, count_params
from kiln.train.trainer import Trainer

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def recipe(name: str, *overrides: str):
    return load_config(RECIPES / f"{name}.toml", overrides)


def meta_counts(cfg) -> dict[str, int]:
    with torch.device("meta"):
        return count_params(Transformer(dataclasses.replace(cfg.model, vocab_size=cfg.tokenizer.vocab_size)))


def test_tiny_recipes_use_the_quickstart_data_and_the_same_training():
    quick, trinity, dense = recipe("quickstart"), recipe("trinity-tiny"), recipe("dense-tiny")
    for cfg in (trinity, dense):
        assert (cfg.data, cfg.prepare, cfg.tokenizer) == (quick.data, quick.prepare, quick.tokenizer)
    assert trinity.train == dense.train and trinity.schedule == dense.schedule
    assert (trinity.run.dir, dense.run.dir) == ("runs/trinity-tiny", "runs/dense-tiny")


def test_trinity_tiny_has_every_trinity_option_on():
    m, o = recipe("trinity-tiny").model, recipe("trinity-tiny").optim
    assert (m.local_per_global, m.global_rope, m.qk_norm, m.attn_gate, m.sandwich_norm,
            m.embed_scale, m.tie_embeddings) == (3, False, True, True, True, True, False)
    assert 0 < m.sliding_window < recipe("trinity-tiny").train.seq_len
    assert m.n_experts == 16 and m.top_k == 2 and m.n_shared == 1 and 0 < m.n_dense_layers < m.n_layers
    assert m.route_scale == pytest.approx(math.sqrt(m.top_k))  # Nano: 2.826 ~ sqrt(8)
    assert m.balance == "smebu" and o.name == "muon"
    assert afmoe_incompatibilities(m) == []  # exports as Hugging Face afmoe
    assert llama_incompatibilities(m)  # ...and is refused by the Llama export


def test_dense_tiny_is_plain_llama():
    assert llama_incompatibilities(recipe("dense-tiny").model) == []


def test_equal_active_parameters_within_two_percent():
    trinity, dense = meta_counts(recipe("trinity-tiny")), meta_counts(recipe("dense-tiny"))
    assert dense["params_active"] == dense["params"]
    assert trinity["params_active"] < 0.7 * trinity["params"]  # sparse: 2 of 16 experts active
    assert abs(trinity["params_active"] / dense["params_active"] - 1) < 0.02
    assert 1e6 < trinity["params"] < 5e6  # "a few million"


@pytest.mark.parametrize("name", ["trinity-tiny", "dense-tiny"])
def test_recipe_trains_on_the_tiny_corpus(tiny_run, name):
    """Two steps of the real recipe shapes (tiny corpus, short sequences): the first loss is
    near ln(vocab), as a fresh model's must be, and MoE runs report MaxVio per MoE layer."""
    base = tiny_config(tiny_run)
    cfg = recipe(name, f'run.dir="{tiny_run}"', "train.seq_len=32", "train.global_batch=4",
                 "train.micro_batch=4", "train.steps=2", "train.precision=fp32")
    cfg = dataclasses.replace(cfg, data=base.data, tokenizer=base.tokenizer)
    trainer = Trainer(cfg, callbacks=[])
    records = [trainer.train_step(), trainer.train_step()]
    vocab = trainer.model_cfg.vocab_size
    assert abs(records[0]["loss"] - math.log(vocab)) < 1.0
    assert all(math.isfinite(r["loss"]) for r in records)
    n_moe = cfg.model.n_layers - cfg.model.n_dense_layers if cfg.model.n_experts else 0
    assert len(records[-1].get("moe_max_vio", [])) == n_moe
    for load, vio in zip(records[-1].get("moe_load", []), records[-1].get("moe_max_vio", [])):
        n = len(load)
        assert n == cfg.model.n_experts and sum(load) == pytest.approx(1.0)
        assert vio == pytest.approx(max(load) * n - 1.0)  # MaxVio = max/mean - 1


@pytest.mark.parametrize("name", ["trinity-nano", "trinity-mini"])
def test_paper_size_recipes_follow_the_digest(name):
    """The Nano column of the digest's config table (from the released config.json); Mini
    shares its routing (128 routed / top-8 / 1 shared) and every architecture switch."""
    m = recipe(name).model
    assert (m.local_per_global, m.global_rope, m.qk_norm, m.attn_gate, m.sandwich_norm,
            m.embed_scale, m.tie_embeddings) == (3, False, True, True, True, True, False)
    assert (m.n_experts, m.top_k, m.n_shared, m.n_dense_layers) == (128, 8, 1, 2)
    assert (m.sliding_window, m.route_scale, m.balance) == (2048, 2.826, "sign")
    # "that rule plus re-centering, plus a sequence-wise balance loss" (Large's weight)
    assert (m.balance_rate, m.seq_aux_coef) == (1e-3, 1e-4)
    if name == "trinity-nano":
        assert (m.n_layers, m.dim, m.dim // m.n_heads, m.n_heads, m.n_kv_heads) == (56, 1024, 128, 8, 2)
        assert (m.ffn_hidden, m.expert_hidden) == (3072, 256)
    assert afmoe_incompatibilities(m) == []
