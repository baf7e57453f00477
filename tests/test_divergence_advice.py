"""A diverged run's message names the settings that set the step that blew up."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from kiln.config import OptimConfig
from kiln.errors import TrainingDiverged
from kiln.train.divergence_advice import divergence_advice
from kiln.train.trainer import Trainer


def test_a_muon_run_diverged_by_its_muon_lr_is_told_to_lower_the_muon_lr(tiny_run):
    """Muon lr 1e6 blows the hidden matrices up in a few steps while optim.lr is 1e-3: the
    message said only "lower optim.lr (0.001...) or set optim.grad_clip", a change that
    leaves the Muon step as it was, and a clip that was on (1.0) already."""
    cfg = tiny_config(tiny_run, "optim.name=muon", "optim.muon_lr=1e6", "optim.lr=1e-3",
                      "schedule.warmup_steps=0", "train.eval_every=0")
    with pytest.raises(TrainingDiverged) as e:
        Trainer(cfg).fit()
    said = str(e.value)
    assert "lower optim.muon_lr (`--set optim.muon_lr=...`: the hidden matrices train at 1e+06)" \
        in said
    assert "set optim.grad_clip" not in said and "lower optim.grad_clip (1 now)" in said


@pytest.mark.parametrize(("settings", "muon_said"), [
    ({"name": "muon", "muon_lr": 0.0}, "train at 0.02 (optim.muon_lr = 0 gives it)"),
    ({"name": "muon", "muon_lr": 0.0, "muon_adjust_lr": "match_rms_adamw"}, None),
    ({"name": "muon", "muon_lr": 5e-3, "muon_adjust_lr": "match_rms_adamw"}, "train at 0.005)"),
    ({"name": "adamw", "muon_lr": 5e-3}, None),  # muon_lr is not read under AdamW
])
def test_the_advice_names_the_muon_lr_only_where_it_sets_the_muon_step(settings, muon_said):
    said = divergence_advice(OptimConfig(lr=3e-3, grad_clip=0.0, **settings))
    assert "optim.lr (`--set optim.lr=...`: 0.003 is what config.toml records now)" in said
    assert said.endswith(" or set optim.grad_clip")  # off: turning it on is the advice
    if muon_said is None:
        assert "muon_lr" not in said
    else:
        assert said.startswith("lower optim.muon_lr") and muon_said in said


def test_the_report_of_a_diverged_muon_run_gives_the_trainers_advice(tiny_run):
    """The report's note of a divergence said "Lower optim.lr or set optim.grad_clip" for
    every run: the Muon run's own advice (its muon_lr) comes from its config.toml, and a
    config.toml that does not read gives the general words, not a failed page."""
    from kiln.report import build_report
    from kiln.run_dir import write_run_metadata

    cfg = tiny_config(tiny_run, "optim.name=muon", "optim.muon_lr=1e6", "optim.lr=1e-3",
                      "schedule.warmup_steps=0", "train.eval_every=0")
    write_run_metadata(cfg)
    with pytest.raises(TrainingDiverged):
        Trainer(cfg).fit()
    html = build_report(tiny_run).read_text(encoding="utf-8")
    assert "Lower optim.muon_lr (`--set optim.muon_lr=...`: the hidden matrices train at " \
           "1e+06)" in html
    assert "set optim.grad_clip" not in html and "lower optim.grad_clip (1 now)" in html
    (tiny_run / "config.toml").write_text("[optim]\nname = 3\n", encoding="utf-8")
    assert "Lower optim.lr or optim.grad_clip, and run" in \
        build_report(tiny_run).read_text(encoding="utf-8")
