"""A loss past what exp can hold: perplexity is inf in `kiln eval`'s line, eval.json and the
report, never a capped figure that reads as a real one."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import kiln.eval.perplexity as perplexity_module
from kiln import strict_json
from kiln.cli import main
from kiln.report import build_report


class HugeLoss(nn.Module):
    """A model whose mean loss on every batch is 800 nats (exp(800) overflows a float)."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.tensor(800.0)


def test_evaluate_gives_an_infinite_perplexity(prepared_data):
    got = perplexity_module.evaluate(HugeLoss(), prepared_data / "tokens", "val", 32, 4, 1,
                                     torch.device("cpu"), "fp32")
    assert got["loss"] == 800.0 and got["perplexity"] == math.inf


def test_eval_line_json_and_report_say_inf(tiny_run, monkeypatch, capsys):
    assert main(["train", str(tiny_run), "--set", "train.steps=2"]) == 0
    real = perplexity_module.evaluate
    monkeypatch.setattr(perplexity_module, "evaluate",
                        lambda model, *a, **k: real(HugeLoss(), *a, **k))
    capsys.readouterr()
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1"]) == 0
    assert "perplexity inf (exp of a loss above 709.78 overflows a float)" in \
        capsys.readouterr().out
    text = (tiny_run / "eval.json").read_text()
    # strict JSON (no bare Infinity, which jq and JSON.parse reject), naming the value
    on_disk = json.loads(text, parse_constant=lambda word: pytest.fail(f"not JSON: {word}"))
    assert on_disk["perplexity"] is None and on_disk["perplexity_not_finite"] == "inf"
    assert strict_json.loads(text)["perplexity"] == math.inf
    page = build_report(tiny_run).read_text(encoding="utf-8")
    assert "<td>inf (exp of a loss above 709.78 overflows a float)</td>" in page


def test_a_capped_perplexity_from_an_older_eval_reads_inf(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps(
        {"split": "val", "loss": 800.0, "perplexity": math.exp(700), "bpb": 1e3}))
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "<td>inf (exp of a loss above 709.78 overflows a float)</td>" in page
    (tmp_path / "eval.json").write_text(json.dumps(
        {"split": "val", "loss": 1.8, "perplexity": math.exp(1.8), "bpb": 2.0}))
    assert f"<td>{math.exp(1.8):.2f}</td>" in build_report(tmp_path).read_text(encoding="utf-8")
