"""eval, generate and export read a trained run as it was trained: the same model settings,
the same tokenizer, finite weights. Anything else would load and silently be wrong."""

from __future__ import annotations

import json

import pytest
from conftest import as_written, tiny_config
from safetensors.torch import load_file, save_file

from kiln.cli import main
from kiln.data.tokenizer import train_tokenizer
from kiln.train.checkpoint_dirs import latest_checkpoint
from kiln.train.trainer import Trainer


@pytest.fixture
def trained(tiny_run):
    Trainer(tiny_config(tiny_run, "train.steps=6")).fit()
    return tiny_run


def _kiln(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def test_model_overrides_that_keep_the_shapes_are_refused(trained, capsys):
    """rope_theta or norm_eps keep every tensor's shape: the weights would load into another
    function (eval numbers, samples and an export's config.json would all be wrong)."""
    for verb, change in (("eval", "model.norm_eps=0.5"), ("generate", "model.rope_theta=100.0"),
                         ("export", "model.rope_theta=100.0")):
        code, err = _kiln(capsys, verb, str(trained), "--set", change)
        key = change.split("=")[0]
        assert code == 2 and f"trained with other model settings than these ({key}:" in err, err
        assert "Traceback" not in err
    assert not (trained / "eval.json").exists() and not (trained / "export").exists()
    # the same function computed by another kernel: allowed
    assert main(["eval", str(trained), "--set", "model.attn_kernel=sdpa"]) == 0


def _tokenizer_json(run):
    return run / "tokenizer" / "tokenizer.json"


def test_a_replaced_tokenizer_is_refused(trained, capsys):
    """A tokenizer.json swapped after `kiln tokenize` maps the model's ids to other text:
    generate would index past the embedding or decode garbage, export would ship it."""
    original = _tokenizer_json(trained).read_text()
    texts = [f"completely different text number {i} " * 5 for i in range(200)]
    train_tokenizer(texts, 300, _tokenizer_json(trained), show_progress=False)
    for verb in ("generate", "export"):
        code, err = _kiln(capsys, verb, str(trained))
        assert code == 1 and "is not the tokenizer the run's token shards were made with" in err
        assert "512 tokens; it has 300" in err
    # the same size, two ids swapped between a 1-byte and a longer token
    spec = json.loads(original)
    vocab = spec["model"]["vocab"]
    short = next(t for t, i in vocab.items() if len(t) == 1 and i > 100)
    long = next(t for t, i in vocab.items() if len(t) > 3)
    vocab[short], vocab[long] = vocab[long], vocab[short]
    _tokenizer_json(trained).write_text(json.dumps(spec))
    code, err = _kiln(capsys, "generate", str(trained))
    assert code == 1 and "it has 512, with other tokens" in err
    _tokenizer_json(trained).write_text(original)
    assert main(["generate", str(trained)]) == 0


def test_shards_re_made_since_training_are_refused(trained, capsys):
    """Following the advice to re-run `kiln tokenize` with another tokenizer makes the
    tokenizer and shards agree again, but not with the checkpoint: its loader state holds
    the fingerprint of the shards it was trained on."""
    from conftest import tiny_config

    from kiln.cli import cmd_tokenize

    texts = [f"completely different text number {i} " * 5 for i in range(200)]
    train_tokenizer(texts, 300, _tokenizer_json(trained), show_progress=False)
    cmd_tokenize(tiny_config(trained))
    for verb in ("eval", "generate", "export"):
        code, err = _kiln(capsys, verb, str(trained))
        assert code == 1 and "was trained on other token shards than" in err, (verb, err)
    assert not (trained / "eval.json").exists() and not (trained / "export").exists()


def test_non_finite_weights_are_refused(trained, capsys):
    path = latest_checkpoint(trained / "checkpoints") / "model.safetensors"
    tensors = load_file(path)
    name = next(k for k in tensors if k.endswith("w_up.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, path)
    as_written(path.parent)
    for verb in ("eval", "generate", "export"):
        code, err = _kiln(capsys, verb, str(trained))
        assert code == 1 and f"holds non-finite weights ({name})" in err, (verb, err)
    assert not (trained / "export").exists() and not (trained / "eval.json").exists()


def test_an_older_checkpoint_read_in_place_of_an_incomplete_latest_is_said(tiny_run, capsys):
    """`latest` names step 6, whose trainer.pt was removed by hand: eval reads step 3, the
    newest complete checkpoint, and said nothing of it (its figures read as step 6's)."""
    trained = tiny_run
    Trainer(tiny_config(tiny_run, "train.steps=6", "train.checkpoint_every=3")).fit()
    (trained / "checkpoints" / "step_00000006" / "trainer.pt").unlink()
    code, err = _kiln(capsys, "eval", str(trained))
    assert code == 0
    assert ("note: checkpoints/latest names step_00000006, which is not a complete checkpoint "
            "(no trainer.pt): reading step_00000003") in err
    assert json.loads((trained / "eval.json").read_text())["checkpoint"] == "step_00000003"


def test_the_older_checkpoint_note_is_said_by_rank_0_alone(tmp_path, monkeypatch, capsys):
    """Under torchrun every rank of `kiln eval` reads the checkpoint: one note, not one each."""
    from kiln.train.trained_run import note_an_older_checkpoint

    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_00000006").mkdir(parents=True)
    (ckpts / "latest").write_text("step_00000006\n")
    monkeypatch.setenv("RANK", "1")
    note_an_older_checkpoint(ckpts / "step_00000003")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    note_an_older_checkpoint(ckpts / "step_00000003")
    assert capsys.readouterr().err.startswith("note: checkpoints/latest names step_00000006")


def test_an_older_checkpoint_read_in_place_of_one_moved_aside_is_said(tmp_path, capsys):
    """`latest` names step 6, moved aside by hand (the way on a damaged checkpoint's error
    gives): eval, generate and export read step 3 and say so, as for an incomplete one."""
    from kiln.train.trained_run import note_an_older_checkpoint

    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_00000006.bad").mkdir(parents=True)
    (ckpts / "latest").write_text("step_00000006\n")
    note_an_older_checkpoint(ckpts / "step_00000003")
    assert capsys.readouterr().err == ("note: checkpoints/latest names step_00000006, which is "
                                       "gone: reading step_00000003, the newest complete one\n")
    # complete by now (a trainer of the run saved it after step 3 was picked): nothing passed over
    (ckpts / "step_00000006").mkdir()
    (ckpts / "step_00000006" / "trainer.pt").write_bytes(b"")
    note_an_older_checkpoint(ckpts / "step_00000003")
    assert capsys.readouterr().err == ""


def test_weights_that_do_not_fit_are_not_blamed_on_a_batch_setting(trained, monkeypatch, capsys):
    """A model trained on a larger machine, evaluated where its weights alone do not fit:
    the allocator's refusal while loading was told as 'lower eval.batch_size' (generate:
    'lower generate.max_new_tokens'), settings that change nothing of it."""
    import torch

    from kiln.train import trained_run

    def huge(*args, **kwargs):
        return torch.empty(2**47, dtype=torch.uint8)  # a real refusal: 128 TiB

    monkeypatch.setattr(trained_run, "load_weights", huge)
    for verb in ("eval", "generate"):
        code, err = _kiln(capsys, verb, str(trained))
        assert code == 1 and "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"kiln: cannot load {trained / 'checkpoints' / 'step_00000006'}: "
                               "out of memory (DefaultCPUAllocator: can't allocate memory"), line
        assert "weights alone do not fit" in line and "batch_size" not in line
        assert "max_new_tokens" not in line
