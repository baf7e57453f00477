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


@pytest.mark.parametrize(("cgroup", "expected"), [
    ({}, (1000 + 24) * 1024),  # no cgroup files: MemAvailable plus free swap
    ({"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "5\n"},
     (1000 + 24) * 1024),  # cgroup v2 without a limit
    ({"/sys/fs/cgroup/memory.max": "600000\n", "/sys/fs/cgroup/memory.current": "100000\n"},
     500000),  # the limit less what the cgroup uses, below the host's figure
    ({"/sys/fs/cgroup/memory.max": "2000000\n", "/sys/fs/cgroup/memory.current": "1\n"},
     (1000 + 24) * 1024),  # a limit above the host's figure does not raise it
    ({"/sys/fs/cgroup/memory.max": "100\n", "/sys/fs/cgroup/memory.current": "300\n"}, 0),
    ({"/sys/fs/cgroup/memory/memory.limit_in_bytes": "700000\n",
      "/sys/fs/cgroup/memory/memory.usage_in_bytes": "50000\n"}, 650000),  # cgroup v1
    ({"/sys/fs/cgroup/memory/memory.limit_in_bytes": str(1 << 62),
      "/sys/fs/cgroup/memory/memory.usage_in_bytes": "50000"}, (1000 + 24) * 1024),  # v1 "none"
    # usage at the limit, mostly the page cache of files read (a dataset): its inactive part
    # is reclaimable, not used (it made a container that had read its data have 0 free)
    ({"/sys/fs/cgroup/memory.max": "600000\n", "/sys/fs/cgroup/memory.current": "600000\n",
      "/sys/fs/cgroup/memory.stat": "anon 100000\nfile 500000\ninactive_file 450000\n"
                                    "active_file 50000\n"}, 450000),
    ({"/sys/fs/cgroup/memory/memory.limit_in_bytes": "700000\n",
      "/sys/fs/cgroup/memory/memory.usage_in_bytes": "700000\n",
      "/sys/fs/cgroup/memory/memory.stat": "cache 600000\ninactive_file 1\n"
                                           "total_inactive_file 400000\n"}, 400000),  # v1
])
def test_free_memory_figure_from_meminfo_and_the_cgroup_limit(monkeypatch, cgroup, expected):
    """The figure from given kernel files: MemAvailable + SwapFree (kB), capped by the
    cgroup's limit less its usage."""
    from pathlib import Path

    files = {"/proc/meminfo": "MemTotal:  9999 kB\nMemFree:  7 kB\nMemAvailable:  1000 kB\n"
                              "SwapTotal:  50 kB\nSwapFree:  24 kB\n", **cgroup}

    def read_text(self, *args, **kwargs):
        if str(self) not in files:
            raise FileNotFoundError(str(self))
        return files[str(self)]

    monkeypatch.setattr(Path, "read_text", read_text)
    assert memory_fit.host_memory_available() == expected


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


def test_a_micro_batchs_activations_count_beside_the_state(monkeypatch):
    """dim 256, 4 layers at 8 x 512 tokens counted 64 MB of state and peaked 866 MB above
    it on CPU: the activations every layer keeps now count, computed here by hand."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    m = _model()  # dim 256, 4 layers, 8 heads of 32, SwiGLU 704 wide
    assert (m.dim, m.n_layers, m.n_heads, m.n_experts) == (256, 4, 8, 0)
    params, tokens = count_model_params(m), 8 * 512
    per_token = {"fp32": 4 * (2 * 256 * 2 + 256 + 2 * 704),
                 "bf16": 4 * 2 * 256 + 2 * (2 * 256 + 256 + 2 * 704)}
    for precision, layer_bytes in per_token.items():
        acts = 4 * tokens * layer_bytes
        assert acts > 4 * params  # more than the gradients, which backward makes as it frees them
        need = params * 16 - 4 * params + acts
        check_training_fits(m, "adamw", CPU, available=need, tokens=tokens, precision=precision)
        with pytest.raises(ConfigError, match=r"and a micro-batch's activations .* "
                                              r"train.micro_batch / train.seq_len"):
            check_training_fits(m, "adamw", CPU, available=need - 1, tokens=tokens,
                                precision=precision)
    # a small model refused for a huge micro-batch says its size, not "0.00B parameters"
    with pytest.raises(ConfigError, match=f"^the model has {params / 1e6:.2f}M parameters: "):
        check_training_fits(m, "adamw", CPU, available=1, tokens=10**6)
    # a short micro-batch: the gradients outweigh its activations, the state alone decides
    check_training_fits(m, "adamw", CPU, available=params * 16, tokens=128)


def test_the_trainer_counts_its_micro_batchs_tokens(tiny_run, monkeypatch):
    from kiln.config import load_config as load
    from kiln.train import trainer

    seen = []

    def stop(*args, **kwargs):
        seen.append(kwargs)
        raise ConfigError("checked")

    monkeypatch.setattr(trainer, "check_training_fits", stop)
    cfg = load(tiny_run / "config.toml", [])
    with pytest.raises(ConfigError, match="checked"):
        trainer.Trainer(cfg)
    micro = min(cfg.train.micro_batch, cfg.train.global_batch)
    assert seen[0]["tokens"] == micro * cfg.train.seq_len
    assert seen[0]["precision"] in ("fp32", "bf16")
    # compiled, the partitioner may recompute what eager keeps: the state alone is counted
    with pytest.raises(ConfigError, match="checked"):
        trainer.Trainer(load(tiny_run / "config.toml", ["train.compile=true"]))
    assert seen[1]["tokens"] == 0
