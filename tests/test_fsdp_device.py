"""FSDP2 shards on a mesh of the training device's type, not of the machine's accelerator,
and moves each block to the device itself.

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
from kiln.parallel.distributed import DistEnv
from kiln.parallel.model_wrapping import parallelize


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


def test_a_model_left_unsharded_is_moved_to_the_device():
    """One process (or DDP) trains the model where `device` says (`meta` stands in for a GPU
    here: a placement the CPU can see)."""
    model = parallelize(_model(), "fsdp", DistEnv(), device=torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.rope_cos.device.type == "meta"


def test_the_trainer_leaves_sharding_to_fsdp(tiny_run, monkeypatch):
    """Under FSDP2 the trainer does not move the whole model to the device before sharding
    it: on a GPU every rank would hold all the fp32 weights at once (a 20-40B model on
    8 x 80 GB passes `memory_fit`'s 1/world_size check, then failed in `.to()`); FSDP2
    moves each block as it shards it. One launched gloo rank, in this process."""
    from conftest import tiny_config

    import kiln.parallel.distributed as distributed
    from kiln.parallel.distributed import shutdown
    from kiln.train.trainer import Trainer

    for key, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                       "TORCHELASTIC_RUN_ID": "test", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "die_with_launcher", lambda: None)  # not pytest's parent
    moved: list[str] = []
    real_to = Transformer.to

    def to(self, *args, **kwargs):
        moved.append(f"{args} {kwargs}")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "to", to)
    trainer = Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=1"),
                      resume=False)
    try:
        assert moved == []
        assert all(hasattr(p, "device_mesh") for p in trainer.model.parameters())  # sharded
        assert trainer.model.rope_cos.device == trainer.device
        trainer.fit()
    finally:
        shutdown(trainer.env)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
