"""A checkpoint's torch.save files (the optimizer's moments: most of its bytes) are hashed as
they are written, not read back; the sums recorded are the files' own, and checkpoints
written the older way still load."""

from __future__ import annotations

import json

import torch
from conftest import as_before_checksums, as_written
from safetensors.torch import load_file, save_file

import kiln.train.checkpoint as ckpt_mod
from kiln.config import ModelConfig
from kiln.hashing import file_sha256
from kiln.model import Transformer
from kiln.parallel.distributed import DistEnv

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
    def read_back(path):  # safetensors has no hook to see its bytes: only its file is read
        if path.name != "model.safetensors":
            raise AssertionError(f"{path} read back after writing it")
        return file_sha256(path)

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


def test_a_checkpoint_whose_checksums_were_removed_is_refused(tmp_path):
    """checksums.json deleted by hand from a checkpoint written with it: read unchecked, as
    one from before checksums. Refused now, naming the file and the checkpoint before it;
    one truly from before (no format in its trainer.pt) still loads."""
    import pytest

    from kiln.errors import CheckpointError

    model, opt = _trained()
    ckpt_mod.save_checkpoint(tmp_path, 1, model, opt, {"step": 1}, DistEnv())
    ckpt = ckpt_mod.save_checkpoint(tmp_path, 2, model, opt, {"step": 2}, DistEnv())
    kept = json.loads((ckpt / ckpt_mod.CHECKSUMS).read_text())
    (ckpt / ckpt_mod.CHECKSUMS).unlink()
    fresh, fresh_opt = _trained(seed=1)
    with pytest.raises(CheckpointError) as e:
        ckpt_mod.load_checkpoint(ckpt, fresh, fresh_opt)
    said = str(e.value)
    assert "step_00000002 is unreadable (FileNotFoundError: " in said, said
    assert str(ckpt / ckpt_mod.CHECKSUMS) in said and "previous one, step_00000001" in said, said
    with pytest.raises(CheckpointError, match="checksums.json"):
        ckpt_mod.load_weights(ckpt, fresh)  # eval, generate, export
    (ckpt / ckpt_mod.CHECKSUMS).write_text(json.dumps(kept))
    as_before_checksums(ckpt)
    assert ckpt_mod.load_checkpoint(ckpt, fresh, fresh_opt)["step"] == 2


def test_large_writes_hashed_on_another_thread_give_the_files_sum(tmp_path):
    """Writes of a megabyte and more are hashed beside the write: the sum is still the one
    of the bytes in their order, written directly and through torch.save."""
    from kiln.hashing import HashingWriter

    big = torch.randn(3, 2**19)  # 6 MB
    with HashingWriter(tmp_path / "mixed.bin") as f:
        for chunk in (b"head", big.numpy().data, b"x" * 10, bytes(range(256)) * 8192):
            f.write(chunk)
    assert f.hexdigest() == file_sha256(tmp_path / "mixed.bin")
    assert ckpt_mod._save_hashed({"m": big}, tmp_path / "o.pt") == file_sha256(tmp_path / "o.pt")
