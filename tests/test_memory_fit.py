"""A model whose training state cannot fit is refused before any work, with the numbers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.train import memory_fit
from kiln.train.memory_fit import GIB, check_training_fits, count_model_params

CPU = torch.device("cpu")


def _model(recipe: str = "recipes/quickstart.toml", vocab: int = 4096):
    cfg = load_config(recipe, [])
    return dataclasses.replace(cfg.model, vocab_size=vocab)


def test_parameters_are_counted_without_memory_and_match_the_built_model():
    from kiln.model.transformer import Transformer, count_params

    m = _model()
    assert count_model_params(m) == count_params(Transformer(m))["params"]


def test_the_state_bytes_decide_at_the_boundary(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    m = _model()
    need = count_model_params(m) * 16
    check_training_fits(m, "adamw", CPU, available=need)  # exactly enough
    with pytest.raises(ConfigError, match=r"needs at least .* GiB for fp32 weights, gradients "
                                          r"and adamw state"):
        check_training_fits(m, "adamw", CPU, available=need - 1)
    check_training_fits(m, "muon", CPU, available=need * 3 // 4)  # one momentum, not two
    # FSDP over 4 GPUs: a quarter each; on CPU, the host's 4 ranks share one memory
    gpu = torch.device("cuda", 0)
    check_training_fits(m, "adamw", gpu, "fsdp", 4, available=need // 4)
    with pytest.raises(ConfigError, match="shard it over more GPUs"):
        check_training_fits(m, "adamw", gpu, "ddp", 4, available=need // 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    check_training_fits(m, "adamw", CPU, "fsdp", 4, available=need)
    with pytest.raises(ConfigError, match=r"\(4 ranks on this host\)"):
        check_training_fits(m, "adamw", CPU, "ddp", 4, available=need)


def test_unknown_free_memory_refuses_nothing(monkeypatch):
    monkeypatch.setattr(memory_fit, "host_memory_available", lambda: None)
    check_training_fits(_model("recipes/trinity-mini.toml", 200192), "muon", CPU)


def test_free_memory_is_read_from_the_kernel():
    free = memory_fit.host_memory_available()
    assert free is not None and 0 < free < 1 << 50


def test_kiln_run_refuses_a_paper_sized_model_before_the_data_stages(tmp_path, monkeypatch, capsys):
    """trinity-mini on a 23 GiB machine: one line with the numbers, nothing prepared."""
    from kiln.cli import main

    monkeypatch.setattr(memory_fit, "host_memory_available", lambda: 23 * GIB)
    run = tmp_path / "mini"
    assert main(["run", "recipes/trinity-mini.toml", "--set", f'run.dir="{run}"']) == 2
    err = capsys.readouterr().err
    # the figure a user recognises (the planned vocabulary's), and the floor that decided
    assert err.startswith("kiln: config error: the model has 25.72B parameters with the "
                          "planned 200,192-token vocabulary (24.90B with the smallest")
    assert "more than this machine's free memory (23.0 GiB)" in err
    assert "vocab_size" not in err.split("make the model smaller")[1]  # shrinking it cannot help
    assert not (run / "documents").exists() and not (run / "prepare.json").exists()


def test_the_trainer_refuses_with_the_tokenizers_vocabulary(tiny_run, monkeypatch):
    """The trainer counts the real vocabulary and refuses before building the model."""
    from kiln.config import load_config as load
    from kiln.train.trainer import Trainer

    monkeypatch.setattr(memory_fit, "host_memory_available", lambda: 1 << 20)  # 1 MiB
    built = []
    monkeypatch.setattr("kiln.train.trainer.Transformer", lambda *a: built.append(a))
    cfg = load(tiny_run / "config.toml", [])
    with pytest.raises(ConfigError, match="more than this machine's free memory"):
        Trainer(cfg)
    assert built == []
