"""`kiln run` after training: eval, generate, export and report each need only the trained
model, so one failing does not cost the user the others; the run then fails naming it."""

from __future__ import annotations

import pytest
from conftest import tiny_config

import kiln.cli as cli
from kiln.config import ConfigError
from kiln.errors import CheckpointError, KilnError


def _stub_run(monkeypatch, failing: dict[str, Exception]) -> list[str]:
    """Every stage of `kiln run` stubbed; those in `failing` raise. Returns those run."""
    ran: list[str] = []

    def stage(name):
        def fn(cfg, **_):
            ran.append(name)
            if name in failing:
                raise failing[name]
        return fn

    for name in ("prepare", "tokenizer", "tokenize", "train", "eval", "generate", "export",
                 "report"):
        monkeypatch.setattr(cli, f"cmd_{name}", stage(name))
    monkeypatch.setattr(cli, "_record_config", lambda cfg: None)
    monkeypatch.setattr(cli, "_refuse_prompts_that_do_not_fit", lambda cfg: None)
    monkeypatch.setattr(cli, "_tokenizer_unless_current", stage("tokenizer"))
    monkeypatch.setattr(cli, "_tokenize_unless_current", stage("tokenize"))
    return ran


def test_a_failed_generate_still_exports_and_reports(tmp_path, monkeypatch, capsys):
    """Generate failing after a long training ran no export before: now export and report
    run, and the run ends with generate's own error."""
    ran = _stub_run(monkeypatch, {"generate": ConfigError("generate.prompts: simulated")})
    with pytest.raises(ConfigError, match="simulated"):
        cli.cmd_run(tiny_config(tmp_path / "run"))
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
        cli.cmd_run(tiny_config(tmp_path / "run"))
    assert ran[3:] == ["train", "report"]
