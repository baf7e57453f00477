"""FSDP2 over 2 gloo ranks resumes exactly: a run stopped right after its step-6 checkpoint
and resumed gives the losses of the run straight through, on 2 ranks (bitwise) and on one
process (the model is sharded from where it was made, not moved whole first: its
checkpoint must read back as it did)."""

from __future__ import annotations

import shutil

import pytest
from conftest import tiny_config
from mp_helpers import run_function_on_ranks

from kiln.report import read_metrics
from kiln.train.trainer import Trainer


def _train_losses(rank: int, world_size: int, run_dir, stop_at: int | None) -> list[float]:
    from kiln.train.callbacks import Callback, default_callbacks

    class StopAt(Callback):
        def on_step_end(self, t, record):
            if t.step == stop_at:
                raise KeyboardInterrupt

    trainer = Trainer(tiny_config(run_dir, "train.parallel=fsdp"),
                      callbacks=[*default_callbacks(), StopAt()])
    try:
        return trainer.fit()
    except KeyboardInterrupt:
        return []


def _losses(run_dir) -> list[float]:
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    return [r["loss"] for r in recs]


def test_fsdp_two_ranks_resume_as_they_ran_straight(tiny_run, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(tiny_run, stopped)
    run_function_on_ranks(_train_losses, 2, args=(tiny_run, None), timeout=300)
    straight = _losses(tiny_run)
    run_function_on_ranks(_train_losses, 2, args=(stopped, 6), timeout=300)
    assert len(_losses(stopped)) == 6  # stopped there: the rest is the resumed run's
    on_one = tmp_path / "on_one"
    shutil.copytree(stopped, on_one)
    run_function_on_ranks(_train_losses, 2, args=(stopped, None), timeout=300)
    assert len(straight) == 12
    assert _losses(stopped)[-6:] == straight[6:]  # bitwise: the same floats
    Trainer(tiny_config(on_one)).fit()  # the 2-rank checkpoint resumed by one process
    assert len(_losses(on_one)) == 12
    for a, b in zip(_losses(on_one)[-6:], straight[6:], strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
