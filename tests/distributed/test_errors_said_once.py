"""Under torchrun an error every rank meets alike (a setting refused, no checkpoint yet) is
said once per node, not once per rank: the same line twice reads as two problems."""

from __future__ import annotations

import shutil

import pytest
from launch import run_ranks


def _failed_output(args: list[str]) -> str:
    """Every rank's output of a command that fails on every rank."""
    with pytest.raises(RuntimeError) as failed:
        run_ranks(args, world_size=2, timeout=120)
    return str(failed.value)


@pytest.mark.parametrize("verb", ["train", "run"])
def test_a_refused_batch_is_said_once(tiny_run, verb):
    out = _failed_output([verb, str(tiny_run), "--set", "train.global_batch=7"])
    assert "rank 1 exited 2" in out  # every rank stops, with the config error's status
    assert out.count("train.global_batch (7) must be divisible by the number of ranks") == 1


def test_no_checkpoint_to_evaluate_is_said_once(tiny_run):
    out = _failed_output(["eval", str(tiny_run)])
    assert "rank 1 exited 1" in out
    assert out.count("no checkpoint in") == 1


def test_a_command_line_mistake_is_said_once(tiny_run):
    """argparse's usage and error come before any of Kiln's handling: said once too."""
    out = _failed_output(["train", str(tiny_run), "--bogus"])
    assert "rank 1 exited 2" in out
    assert out.count("unrecognized arguments: --bogus") == 1


def test_missing_token_shards_are_said_once(tiny_run):
    """The trainer reads the vocabulary from the shards before any rank's work differs:
    `kiln train` before `kiln tokenize` (the commonest slip) said its advice once per rank."""
    shutil.rmtree(tiny_run / "tokens")
    out = _failed_output(["train", str(tiny_run)])
    assert "rank 1 exited 1" in out
    assert out.count("no token shards at") == 1


def test_a_vocabulary_below_the_tokenizers_is_said_once(tiny_run):
    out = _failed_output(["train", str(tiny_run), "--set", "model.vocab_size=258"])
    assert "rank 1 exited 2" in out
    assert out.count("model.vocab_size (258) is smaller than the tokenizer's") == 1


def test_data_made_with_other_settings_is_said_once(tiny_run):
    out = _failed_output(["train", str(tiny_run), "--set", "tokenizer.vocab_size=300"])
    assert "rank 1 exited 2" in out
    assert out.count("was made with other settings") == 1


def test_a_divergence_is_said_once(tiny_run):
    """Every rank finds it on the same agreed figures (the ranks' mean loss, the global
    gradient norm) and stops at the same step: one line per node, not one per rank."""
    out = _failed_output(["train", str(tiny_run), "--set", "optim.lr=1e30", "--set",
                          "optim.grad_clip=0"])
    assert "rank 1 exited 1" in out
    assert out.count("training diverged at step") == 1, out
