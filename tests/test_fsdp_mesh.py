"""FSDP2 shards on a mesh of the training device's type, not of the machine's accelerator.

FSDP2's default mesh is the accelerator's (CUDA wherever a GPU is visible): a run told to
train on the CPU (`train.device = 'cpu'`, gloo) on a GPU machine had every rank's weights
moved to cuda:0 while its batches stayed on the CPU. Shown here on a CPU-only torch by
making the accelerator say CUDA (one in-process gloo rank).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist

from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.parallel.distributed import DistEnv, parallelize


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistEnv(launched=True)
    finally:
        dist.destroy_process_group()


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                   max_seq_len=16, ffn_hidden=48))


def _gpu_machine():
    """The accelerator FSDP2 defaults to says CUDA (torch >= 2.6 asks `_get_accelerator`,
    2.5 `torch.cuda.is_available`)."""
    patches = [mock.patch("torch.cuda.is_available", return_value=True)]
    if hasattr(torch._C, "_get_accelerator"):
        patches.append(mock.patch("torch._C._get_accelerator", return_value=torch.device("cuda")))
    return patches


@pytest.mark.parametrize("given", [True, False], ids=["device-given", "from-weights"])
def test_fsdp_on_cpu_stays_on_cpu_where_a_gpu_is_visible(one_rank, given):
    model = _model()
    patches = _gpu_machine()
    for p in patches:
        p.start()
    try:
        device = {"device": torch.device("cpu")} if given else {}  # else: the weights'
        wrapped = parallelize(model, "fsdp", one_rank, **device)
    finally:
        for p in reversed(patches):
            p.stop()
    params = list(wrapped.parameters())
    assert all(p.device_mesh.device_type == "cpu" for p in params)
    assert all(p.to_local().device.type == "cpu" for p in params)
    tokens = torch.randint(0, 64, (2, 9))
    loss = wrapped(tokens[:, :-1], targets=tokens[:, 1:])  # trains where its batches are
    loss.backward()
    assert torch.isfinite(loss)
