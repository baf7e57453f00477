"""Plot points matplotlib cannot draw (a diverged run's inf or nan) are named on the plot,
not silently left out: a curve that just ends reads as a run that stopped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from kiln.report import build_report


@pytest.fixture
def saved_figures(monkeypatch) -> list[Figure]:
    saved: list[Figure] = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (saved.append(self),
                                                                   real_savefig(self, *a, **k)))
    return saved


def _run(run: Path, losses: list[float]) -> Path:
    run.mkdir(parents=True)
    records = [{"kind": "train", "step": s, "loss": v, "lr": 1e-3}
               for s, v in enumerate(losses, start=1)]
    records.append({"kind": "val", "step": 2, "val_loss": 3.0, "val_bpb": math.nan})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_non_finite_points_are_noted_on_the_plot(tmp_path, saved_figures):
    build_report(_run(tmp_path / "run", [4.0, 3.5, math.inf, math.inf]))
    by_title = {fig.axes[0].get_title(): _texts(fig) for fig in saved_figures}
    assert by_title["Loss"] == ["train loss: 2 non-finite points not drawn (first inf at step 3)"]
    assert by_title["Validation bits per byte"] == [
        "val bits/byte: 1 non-finite point not drawn (first nan at step 2)"]
    assert by_title["Learning rate"] == []  # every point drawn: nothing to say


def test_non_finite_points_are_noted_on_the_comparison(tmp_path, saved_figures):
    a = _run(tmp_path / "a", [4.0, math.inf])
    b = _run(tmp_path / "b", [4.0, 3.0])
    build_report(a, compare=[b])
    [fig] = [f for f in saved_figures if len(f.axes) == 2]
    loss_ax, bpb_ax = fig.axes
    assert [t.get_text() for t in loss_ax.texts] == [
        "a: 1 non-finite point not drawn (first inf at step 2)"]
    assert [t.get_text() for t in bpb_ax.texts] == [
        "a: 1 non-finite point not drawn (first nan at step 2)\n"
        "b: 1 non-finite point not drawn (first nan at step 2)"]
