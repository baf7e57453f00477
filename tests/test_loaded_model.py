"""eval, generate and export load a trained model with no init: it is built with its
parameters on the meta device and given the loaded tensors in their place. A CPU build drew
a random init into every weight only to overwrite it (seconds for a large model), and held
the model twice at the load's peak. The loaded model must be the one the old way gave: the
same tensors, dtypes, tie and outputs, to the bit, and the same errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import as_written, tiny_config
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.cli import main
from kiln.errors import CheckpointError
from kiln.export import export_native, load_native
from kiln.model import Transformer
from kiln.train import trained_run
from kiln.train.checkpoint import load_weights
from kiln.train.checkpoint_dirs import latest_checkpoint
from kiln.train.train_setup import model_config_for_run
from kiln.train.trained_run import load_trained_model
from kiln.train.trainer import Trainer

TIED = "model.tie_embeddings=true"


class RandomDraws(TorchDispatchMode):
    """Records every random op that writes real numbers (not a meta tensor's placeholder)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.Tag.nondeterministic_seeded in func.tags:
            first = args[0] if args and isinstance(args[0], torch.Tensor) else out
            if not (isinstance(first, torch.Tensor) and first.is_meta):
                self.seen.append(str(func))
        return out


def old_way(model_cfg, ckpt: Path) -> Transformer:
    """How eval, generate and export loaded before: a CPU build, overwritten."""
    model = Transformer(model_cfg)
    load_weights(ckpt, model)
    return model.eval()


def _trained(run: Path, *extra: str):
    cfg = tiny_config(run, "train.steps=6", *extra)
    Trainer(cfg).fit()
    return cfg


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_loaded_model_draws_nothing_and_is_the_old_model_to_the_bit(tiny_run, tied):
    cfg = _trained(tiny_run, f"model.tie_embeddings={str(tied).lower()}")
    before = torch.get_rng_state()
    with RandomDraws() as draws:
        model, ckpt = load_trained_model(cfg)
    assert draws.seen == []  # the old way drew normal_ into every weight matrix
    assert torch.equal(torch.get_rng_state(), before)  # and moved the CPU generator
    old = old_way(model_config_for_run(cfg, tiny_run / "tokens"), ckpt)
    assert not model.training
    assert (model.head.weight is model.embed.weight) == tied
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in old.parameters())
    for (name, t), (old_name, o) in zip(model.state_dict(keep_vars=True).items(),
                                        old.state_dict(keep_vars=True).items(), strict=True):
        assert name == old_name and t.device.type == "cpu" and t.dtype == o.dtype == torch.float32
        assert type(t) is type(o) and t.requires_grad == o.requires_grad and torch.equal(t, o)
    for (name, b), (_, o) in zip(model.named_buffers(), old.named_buffers(), strict=True):
        assert torch.equal(b, o), name
    x = torch.randint(0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x), old(x))


def test_eval_and_generate_write_what_they_wrote_before(tiny_run, monkeypatch):
    _trained(tiny_run, TIED)
    outputs = []
    for way in ("new", "old"):
        if way == "old":
            monkeypatch.setattr(trained_run, "loaded_model", lambda c, ckpt: old_way(c, ckpt))
        assert main(["eval", str(tiny_run)]) == 0
        assert main(["generate", str(tiny_run)]) == 0
        outputs.append([json.loads((tiny_run / name).read_text())
                        for name in ("eval.json", "samples.json")])
    assert outputs[0] == outputs[1]


def _checkpoint_altered(run: Path, change) -> Path:
    ckpt = latest_checkpoint(run / "checkpoints")
    tensors = load_file(str(ckpt / "model.safetensors"))
    change(tensors)
    # a new file in the old one's place, as Kiln writes: a model loaded before maps the old
    # file's pages (safetensors 0.4 rewrote a file in place, under that mapping; 0.8 does not)
    save_file(tensors, str(ckpt / "model.safetensors.new"))
    os.replace(ckpt / "model.safetensors.new", ckpt / "model.safetensors")
    as_written(ckpt)  # past the checksum: the fit of the tensors is what is checked
    return ckpt


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape", "dtype"])
def test_a_checkpoint_that_does_not_fit_gives_the_error_it_gave(tiny_run, change):
    cfg = _trained(tiny_run, TIED)

    def alter(t: dict[str, torch.Tensor]) -> None:
        if change == "missing":
            del t["norm.weight"]
        elif change == "unexpected":
            t["extra.weight"] = torch.zeros(3)
        elif change == "shape":
            t["norm.weight"] = t["norm.weight"][:-1].clone()
        else:
            t["norm.weight"] = t["norm.weight"].half()

    ckpt = _checkpoint_altered(tiny_run, alter)
    with pytest.raises(CheckpointError) as old:
        old_way(model_config_for_run(cfg, tiny_run / "tokens"), ckpt)
    with pytest.raises(CheckpointError) as new:
        load_trained_model(cfg)
    assert str(new.value) == str(old.value) and "does not fit this model" in str(new.value)
    # which file: the one line is all the user gets (eval, generate, export, a resume)
    assert f"checkpoint {ckpt / 'model.safetensors'} does not fit" in str(new.value)


def _native(run: Path) -> tuple[Path, Transformer]:
    cfg = _trained(run, TIED)
    model, ckpt = load_trained_model(cfg)
    out = export_native(model, run / "tokenizer" / "tokenizer.json", run / "native", cfg,
                        "a test", ckpt.name)
    return out, model


def test_load_native_draws_nothing_and_keeps_the_tie(tiny_run):
    out, model = _native(tiny_run)
    before = torch.get_rng_state()
    with RandomDraws() as draws:
        back = load_native(out)
    assert draws.seen == [] and torch.equal(torch.get_rng_state(), before)
    assert back.head.weight is back.embed.weight and not back.training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in back.parameters())
    x = torch.randint(0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(back(x), model(x))


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_load_native_of_a_file_that_does_not_fit_gives_the_error_it_gave(tiny_run, change):
    out, model = _native(tiny_run)
    tensors = load_file(str(out / "model.safetensors"))
    if change == "missing":
        del tensors["layers.0.attn_norm.weight"]
    elif change == "unexpected":
        tensors["extra.weight"] = torch.zeros(3)
    else:
        tensors["norm.weight"] = tensors["norm.weight"][:-1].clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "kiln-native"})
    tensors["head.weight"] = tensors["embed.weight"]
    with pytest.raises(RuntimeError) as old:  # the old way: a CPU build, load_state_dict
        Transformer(model.cfg).load_state_dict(tensors, strict=True)
    with pytest.raises(RuntimeError) as new:
        load_native(out)
    assert str(new.value) == str(old.value)


def test_load_native_casts_a_tensor_of_another_dtype_to_the_models(tiny_run):
    """The copy into a built model cast it; assigned as it is, the model would be half bf16."""
    out, model = _native(tiny_run)
    tensors = load_file(str(out / "model.safetensors"))
    tensors["norm.weight"] = tensors["norm.weight"].bfloat16()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "kiln-native"})
    back = load_native(out)
    assert all(t.dtype == torch.float32 for t in back.state_dict().values())
    assert torch.equal(back.norm.weight, tensors["norm.weight"].float())


def _with_head(tensors: dict[str, torch.Tensor], differs: bool) -> None:
    """A tied model's file that also holds a head.weight: the embedding's, or another."""
    tensors["head.weight"] = tensors["embed.weight"].clone() + (1.0 if differs else 0.0)


@pytest.mark.parametrize("way", ["meta", "cpu"])
def test_a_tied_checkpoint_with_a_head_of_its_own_is_refused_if_it_differs(tiny_run, way):
    """A checkpoint whose head.weight is not its embed.weight, loaded into a tied model, had
    its head silently replaced by the embedding: another model, without a word. Now it is
    refused, naming the file, by every way of loading it (the meta build of eval, generate
    and export; a CPU build, as a resume loads); a head equal to the embedding loads."""
    cfg = _trained(tiny_run, TIED)
    model_cfg = model_config_for_run(cfg, tiny_run / "tokens")
    load = (lambda: load_trained_model(cfg)[0]) if way == "meta" else \
        (lambda: old_way(model_cfg, latest_checkpoint(tiny_run / "checkpoints")))
    before = load()
    ckpt = _checkpoint_altered(tiny_run, lambda t: _with_head(t, differs=False))
    same = load()
    assert same.head.weight is same.embed.weight
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(),
                                                 before.state_dict().values(), strict=True))
    _checkpoint_altered(tiny_run, lambda t: _with_head(t, differs=True))
    with pytest.raises(CheckpointError) as refused:
        load()
    said = str(refused.value)
    assert said.startswith(f"{ckpt / 'model.safetensors'}: its head.weight is not tied to its "
                           "embed.weight") and "model.tie_embeddings" in said and "\n" not in said


def test_kiln_eval_of_a_tied_run_whose_head_differs_says_so_in_one_line(tiny_run, capsys):
    _trained(tiny_run, TIED)
    ckpt = _checkpoint_altered(tiny_run, lambda t: _with_head(t, differs=True))
    capsys.readouterr()
    assert main(["eval", str(tiny_run)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tiny_run / "eval.json").exists()
    assert err.strip() == next(line for line in err.splitlines() if line.startswith("kiln: "))
    assert f"{ckpt / 'model.safetensors'}: its head.weight is not tied" in err


@pytest.mark.parametrize("differs", [False, True], ids=["equal", "different"])
def test_load_native_of_a_tied_file_with_a_head_of_its_own(tiny_run, differs):
    """A native export of a tied model that holds a head.weight too: equal to the embedding,
    it loads (it was refused, equal or not); different, it is refused as a checkpoint is."""
    out, model = _native(tiny_run)
    tensors = load_file(str(out / "model.safetensors"))
    _with_head(tensors, differs)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "kiln-native"})
    if differs:
        with pytest.raises(CheckpointError, match=r"model\.safetensors: its head\.weight is not "
                                                  r"tied to its embed\.weight"):
            load_native(out)
        return
    back = load_native(out)
    assert back.head.weight is back.embed.weight
    assert torch.equal(back.embed.weight, model.embed.weight)
