"""A days-long run logs a million records: the report reads them in memory proportionate to
their figures, and draws curves a reader can see (not a million points in 800 pixels)."""

from __future__ import annotations

import json
import math
import tracemalloc

from matplotlib.figure import Figure

from kiln.report.metrics_io import read_metrics
from kiln.report.plots import Series, draw_series


def _record(step: int) -> dict:
    return {"kind": "train", "step": step, "loss": 2.0 + 1 / step, "loss_steps": 1, "lr": 3e-4,
            "grad_norm": 1.0, "tokens": step * 4096, "tokens_per_s": 5e4 + step % 7,
            "elapsed_s": step * 0.1}


def _traced_bytes(make) -> int:
    tracemalloc.start()
    try:
        kept = make()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return held


def test_records_share_their_keys_so_a_long_run_reads_in_half_the_memory(tmp_path):
    lines = [json.dumps(_record(s)) for s in range(1, 20_001)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    plain = _traced_bytes(lambda: [json.loads(line) for line in lines])
    read = _traced_bytes(lambda: read_metrics(tmp_path / "metrics.jsonl"))
    assert read < 0.7 * plain, f"{read / 20_000:.0f} bytes a record, json alone {plain / 20_000:.0f}"
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1] == _record(20_000) and len(records) == 20_000


def test_a_million_point_curve_is_drawn_as_bucket_means_with_their_range():
    """The line holds at most a few thousand points; the band around it keeps each bucket's
    extremes, so a loss spike stays on the plot."""
    n = 200_000
    values = [2.0 + 1 / s for s in range(1, n + 1)]
    values[123_456] = 50.0  # one spike
    ax = Figure().add_subplot()
    draw_series(ax, [Series("train loss", list(range(1, n + 1)), values)])
    [line] = ax.lines
    assert len(line.get_xdata()) <= 4000
    assert line.get_xdata()[0] >= 1 and line.get_xdata()[-1] <= n
    [band] = ax.collections
    top = max(y for path in band.get_paths() for _, y in path.vertices)
    assert math.isclose(top, 50.0)
    assert "mean" in line.get_label()


def test_a_short_curve_is_drawn_point_for_point():
    ax = Figure().add_subplot()
    draw_series(ax, [Series("train loss", [1, 2, 3], [3.0, 2.0, 1.0])])
    assert list(ax.lines[0].get_xdata()) == [1, 2, 3] and not ax.collections


def test_moe_load_is_kept_on_the_newest_record_only(tmp_path):
    """An MoE run logs every layer's per-expert load in each record (trinity-nano: 54 x 128
    floats); the report shows the newest one only, so the reader keeps it there alone (on
    every record, a 100,000-record nano run needed ~22 GB to report). The load table is the
    newest step's."""
    from kiln.report import build_report

    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for step in range(1, 201):
            load = [[step / 1000, 1 - step / 1000]] * 3
            f.write(json.dumps({"kind": "train", "step": step, "loss": 2.0, "moe_load": load,
                                "moe_max_vio": [0.1, 0.2, 0.3]}) + "\n")
    records = read_metrics(path)
    assert len(records) == 200
    assert [r["step"] for r in records if "moe_load" in r] == [200]
    assert records[-1]["moe_load"] == [[0.2, 0.8]] * 3
    assert all("moe_max_vio" in r for r in records)  # the MaxVio curve keeps every point
    (tmp_path / "config.toml").write_text("")
    html = build_report(tmp_path).read_text()
    assert "20.0%" in html and "80.0%" in html  # the newest step's shares
