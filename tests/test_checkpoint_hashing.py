"""Checkpoint files are hashed as they are written (no second full read of gigabytes); the
sums recorded are the files' own, and checkpoints written the older way still load."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import as_written
from safetensors.torch import load_file, save_file

import kiln.train.checkpoint as ckpt_mod
from kiln.config import ModelConfig
from kiln.hashing import file_sha256
from kiln.model import Transformer
from kiln.parallel.distributed import DistEnv
from kiln.tensor_files import save_tensors

FILES = ("model.safetensors", "optimizer.pt", "trainer.pt")


def _trained(seed: int = 0) -> tuple[Transformer, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2,
                                    n_kv_heads=1, max_seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 300, (2, 8))).float().mean().backward()
    opt.step()
    return model, opt


def test_a_save_records_the_files_sums_without_reading_them_back(tmp_path, monkeypatch):
    def read_back(path):
        raise AssertionError(f"{path} read back after writing it")

    model, opt = _trained()
    with monkeypatch.context() as m:
        m.setattr(ckpt_mod, "file_sha256", read_back)
        ckpt = ckpt_mod.save_checkpoint(tmp_path, 1, model, opt, {"step": 1}, DistEnv())
    sums = json.loads((ckpt / ckpt_mod.CHECKSUMS).read_text())
    assert sums == {name: file_sha256(ckpt / name) for name in FILES}
    fresh, fresh_opt = _trained(seed=1)
    assert ckpt_mod.load_checkpoint(ckpt, fresh, fresh_opt)["step"] == 1
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"],
                       fresh_opt.state_dict()["state"][0]["exp_avg"])


def test_a_checkpoint_written_the_older_way_still_loads(tmp_path):
    model, opt = _trained()
    ckpt = ckpt_mod.save_checkpoint(tmp_path, 1, model, opt, {"step": 1}, DistEnv())
    weights = load_file(str(ckpt / "model.safetensors"))
    save_file(weights, str(ckpt / "model.safetensors"))  # safetensors' own writer
    torch.save(torch.load(ckpt / "optimizer.pt", weights_only=True), ckpt / "optimizer.pt")
    as_written(ckpt)
    fresh, fresh_opt = _trained(seed=1)
    ckpt_mod.load_checkpoint(ckpt, fresh, fresh_opt)
    assert torch.equal(fresh.embed.weight, model.embed.weight)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_streamed_safetensors_are_the_bytes_safetensors_writes(tmp_path, metadata):
    tensors = {"b.w": torch.randn(7, 5), "a.bias": torch.randn(3).to(torch.bfloat16),
               "steps": torch.arange(4), "flags": torch.tensor([True, False]),
               "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
               "half": torch.randn(2, 2).half()}
    digest = save_tensors(tensors, tmp_path / "ours.safetensors", metadata=metadata)
    save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata=metadata)
    ours = (tmp_path / "ours.safetensors").read_bytes()
    assert ours == (tmp_path / "theirs.safetensors").read_bytes()
    assert digest == file_sha256(tmp_path / "ours.safetensors")
    back = load_file(str(tmp_path / "ours.safetensors"))
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())


def test_a_dtype_left_to_safetensors_is_still_hashed_right(tmp_path):
    tensors = {"z": torch.randn(3, dtype=torch.complex64), "w": torch.randn(2)}
    digest = save_tensors(tensors, tmp_path / "c.safetensors")
    assert digest == file_sha256(tmp_path / "c.safetensors")
    assert torch.equal(load_file(str(tmp_path / "c.safetensors"))["z"], tensors["z"])


def test_large_writes_hashed_on_another_thread_give_the_files_sum(tmp_path):
    """Writes of a megabyte and more are hashed beside the write: the sum is still the one
    of the bytes in their order, through torch.save and the safetensors stream alike."""
    from kiln.hashing import HashingWriter

    big = torch.randn(3, 2**19)  # 6 MB
    with HashingWriter(tmp_path / "mixed.bin") as f:
        for chunk in (b"head", big.numpy().data, b"x" * 10, bytes(range(256)) * 8192):
            f.write(chunk)
    assert f.hexdigest() == file_sha256(tmp_path / "mixed.bin")
    assert ckpt_mod._save_hashed({"m": big}, tmp_path / "o.pt") == file_sha256(tmp_path / "o.pt")
    assert save_tensors({"m": big, "s": torch.ones(2)}, tmp_path / "w.safetensors") \
        == file_sha256(tmp_path / "w.safetensors")
