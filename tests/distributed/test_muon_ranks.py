"""Muon under FSDP2 on 2 gloo ranks gives the parameters of the single-process run.

The test runs this file as a script on two ranks (`main`), then repeats the same steps in
one process and compares the full weights. Covered: 2-D weights sharded on rows (gathered,
orthogonalised, re-sliced, including an uneven 13/12 split), expert stacks sharded over
experts (orthogonalised locally, 3/2 split), tied embeddings, and AdamW on DTensors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kiln.atomic import atomic_path
from kiln.config import ModelConfig, OptimConfig
from kiln.model import Transformer
from kiln.optim import build_optimizer

STEPS, BATCH = 4, 4


class Experts(nn.Module):
    """An expert stack (E=5, out, in), a 25-row matrix and a gain: uneven shards on 2 ranks."""

    def __init__(self):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(5, 24, 16) * 0.2)
        self.proj = nn.Linear(16, 25)
        self.gain = nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("eoi,bi->beo", self.w_in, x * self.gain).tanh().sum(1)
        return (h[:, :1] * self.proj(x)).pow(2).mean()


def optim_config() -> OptimConfig:
    cfg = OptimConfig(name="muon", lr=3e-3)
    cfg.muon_ns_dtype = "fp32"  # bf16 rounding would hide the sharding logic behind noise
    return cfg


def build(seed: int) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    lm = Transformer(ModelConfig(vocab_size=128, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                 max_seq_len=16, ffn_hidden=48))
    return lm, Experts()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 128, (BATCH, 13), generator=g), torch.randn(BATCH, 16, generator=g))
            for _ in range(STEPS)]


def train(lm: nn.Module, experts: nn.Module, rank: int, world: int) -> None:
    opt_lm, opt_ex = build_optimizer(lm, optim_config()), build_optimizer(experts, optim_config())
    per = BATCH // world
    for tokens, x in batches():
        tokens, x = tokens[rank * per:(rank + 1) * per], x[rank * per:(rank + 1) * per]
        logits = lm(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        experts(x).backward()
        for opt in (opt_lm, opt_ex):
            opt.step()
            opt.zero_grad(set_to_none=True)
    if world > 1:  # momentum lives on the local shard only (ZeRO-1 memory)
        buf = opt_ex.state[experts.w_in]["momentum_buffer"]
        assert buf.to_local().shape[0] == (3 if rank == 0 else 2), buf.to_local().shape


def full_weights(*models: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for i, model in enumerate(models):
        for name, p in model.named_parameters():
            p = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[f"{i}.{name}"] = p.detach().clone()
    return out


def main(out_path: str) -> None:
    import torch.distributed as dist

    from kiln.parallel.distributed import DistEnv, init_distributed
    from kiln.parallel.model_wrapping import wrap_model

    env: DistEnv = init_distributed(torch.device("cpu"))
    lm, experts = build(0)
    lm = wrap_model(lm, "fsdp", env)
    from torch.distributed.fsdp import fully_shard

    fully_shard(experts)
    train(lm, experts, env.rank, env.world_size)
    weights = full_weights(lm, experts)
    if env.is_main:
        with atomic_path(out_path) as tmp:
            torch.save(weights, tmp)
    dist.barrier()
    dist.destroy_process_group()


def test_fsdp2_muon_matches_single_process(tmp_path):
    from launch import run_python

    out = tmp_path / "two_ranks.pt"
    run_python([str(Path(__file__).resolve()), str(out)], world_size=2, timeout=240)
    two = torch.load(out, weights_only=True)
    lm, experts = build(0)
    start = full_weights(lm, experts)
    train(lm, experts, 0, 1)
    one = full_weights(lm, experts)
    assert two.keys() == one.keys()
    for name in one:
        assert (one[name] - start[name]).abs().max() > 1e-4, f"{name} did not move"
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)


if __name__ == "__main__":
    main(sys.argv[1])
