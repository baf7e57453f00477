"""`kiln run` after training: eval, generate, export and report each need only the trained
model, so one failing does not cost the user the others; the run then fails naming it."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config

import kiln.cli as cli
from kiln.commands import run as run_chain
from kiln.config import ConfigError
from kiln.errors import CheckpointError, KilnError


def _stub_run(monkeypatch, failing: dict[str, Exception]) -> list[str]:
    """Every stage of `kiln run` stubbed (where the chain looks them up: kiln.commands.run);
    those in `failing` raise. Returns those run."""
    ran: list[str] = []

    def stage(name):
        def fn(cfg, **_):
            ran.append(name)
            if name in failing:
                raise failing[name]
        return fn

    for name in ("prepare", "tokenizer", "tokenize", "train", "eval", "generate", "export",
                 "report"):
        monkeypatch.setattr(run_chain, f"cmd_{name}", stage(name))
    monkeypatch.setattr(run_chain, "record_config", lambda cfg: None)
    monkeypatch.setattr(run_chain, "refuse_prompts_that_do_not_fit", lambda cfg: None)
    monkeypatch.setattr(run_chain, "_tokenizer_unless_current", stage("tokenizer"))
    monkeypatch.setattr(run_chain, "_tokenize_unless_current", stage("tokenize"))
    return ran


def test_a_failed_generate_still_exports_and_reports(tmp_path, monkeypatch, capsys):
    """Generate failing after a long training ran no export before: now export and report
    run, and the run ends with generate's own error."""
    ran = _stub_run(monkeypatch, {"generate": ConfigError("generate.prompts: simulated")})
    with pytest.raises(ConfigError, match="simulated"):
        run_chain.cmd_run(tiny_config(tmp_path / "run"))
    assert ran == ["prepare", "tokenizer", "tokenize", "train", "eval", "generate", "export",
                   "report"]
    err = capsys.readouterr().err
    assert "kiln: run: generate failed (ConfigError: generate.prompts: simulated); export, " \
        "report do not need it and go on" in err
    assert "[export done in" in err and "[report done in" in err


def test_several_failures_are_each_named_and_the_exit_status_is_not_zero(tmp_path, monkeypatch,
                                                                          capsys):
    ran = _stub_run(monkeypatch, {"eval": CheckpointError("eval: simulated"),
                                  "export": OSError(28, "No space left on device")})
    code = cli.main(["run", "--set", f'run.dir="{tmp_path / "run"}"'])
    err = capsys.readouterr().err
    assert code == 1, err
    assert ran[-4:] == ["eval", "generate", "export", "report"]
    last = err.strip().splitlines()[-1]
    assert last.startswith("kiln: run: eval failed (CheckpointError: eval: simulated); "
                           "export failed (OSError: [Errno 28] No space left on device)")
    assert "Traceback" not in err


def test_a_failed_train_blocks_the_model_stages_but_is_reported(tmp_path, monkeypatch):
    ran = _stub_run(monkeypatch, {"train": KilnError("diverged (simulated)")})
    with pytest.raises(KilnError, match="simulated"):
        run_chain.cmd_run(tiny_config(tmp_path / "run"))
    assert ran[3:] == ["train", "report"]


def test_kiln_run_fresh_archives_the_trained_model_and_remakes_the_data(tiny_run, capsys):
    """`kiln run` refused re-making a trained run's data and pointed to `kiln train
    --fresh`, which needs the recipe's --set options again and re-makes no data; `kiln run`
    had no --fresh. Now it has, with `kiln train --fresh`'s meaning: the earlier model's
    outputs move to archive/ (never deleted), and the run trains again from step 0."""
    from kiln.cli import main

    assert main(["train", str(tiny_run)]) == 0
    assert main(["run", str(tiny_run), "--set", "tokenizer.vocab_size=400"]) == 2
    err = capsys.readouterr().err
    assert "start the model over with `kiln run --fresh`" in err
    assert main(["run", str(tiny_run), "--set", "model.dim=32"]) == 2
    err = capsys.readouterr().err
    assert "`kiln run --fresh` with the same recipe and --set options" in err
    assert "`kiln train --fresh`" not in err

    assert main(["run", str(tiny_run), "--fresh", "--set", "tokenizer.vocab_size=400"]) == 0
    [archive] = (tiny_run / "archive").glob("before-fresh-*")
    assert (archive / "checkpoints" / "step_00000012").is_dir()
    assert (archive / "metrics.jsonl").is_file()
    assert (tiny_run / "checkpoints" / "step_00000012").is_dir()  # trained again
    assert "vocab_size = 400" in (tiny_run / "config.toml").read_text()
    assert json.loads((tiny_run / "tokenizer" / "made_from.json").read_text())[
        "vocab_size"] == 400  # the data re-made with the new setting


def test_kiln_run_fresh_is_documented_in_its_help():
    from kiln.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    text = " ".join(run.format_help().split())
    assert "--fresh" in text and "archive/before-fresh-" in text
