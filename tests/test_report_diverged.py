"""The report of a run that diverged says so: nothing of the poisoned step is logged, so
without a record of the divergence its last logged step reads as a run that was killed."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from kiln.errors import TrainingDiverged
from kiln.report import build_report, read_metrics
from kiln.train.trainer import Trainer

DIVERGING = ("optim.lr=1e4", "optim.grad_clip=0", "train.checkpoint_every=2",
             "schedule.warmup_steps=0")


def _diverge(run_dir) -> int:
    """Train until the loss turns NaN; the step it happened at."""
    with pytest.raises(TrainingDiverged, match=r"diverged at step (\d+)") as stopped:
        Trainer(tiny_config(run_dir, *DIVERGING)).fit()
    return int(stopped.value.args[0].split("diverged at step ")[1].split(":")[0])


def test_the_report_of_a_diverged_run_says_where_it_diverged(tiny_run):
    step = _diverge(tiny_run)
    html = build_report(tiny_run).read_text(encoding="utf-8")
    assert f"Training diverged at step {step} (loss nan" in html
    assert "was killed?" not in html
    assert all(r["step"] < step for r in read_metrics(tiny_run / "metrics.jsonl")
               if r["kind"] != "diverged")  # still nothing of the poisoned step


def test_a_resume_from_before_the_divergence_clears_it_from_the_report(tiny_run):
    step = _diverge(tiny_run)
    Trainer(tiny_config(tiny_run, "train.checkpoint_every=2")).fit()  # the recipe's own lr
    html = build_report(tiny_run).read_text(encoding="utf-8")
    assert "diverged" not in html
    assert [r["step"] for r in read_metrics(next((tiny_run / "archive").iterdir())
                                            / "metrics.jsonl") if r["kind"] == "diverged"] == [step]
