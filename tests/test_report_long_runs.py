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


def _newest_holder_only(records: list[dict]) -> list[dict]:
    """What `newest_only=("moe_load",)` must give: every record as read in full, moe_load
    left on the last of them that holds it."""
    holders = [i for i, r in enumerate(records) if "moe_load" in r]
    return [{k: v for k, v in r.items() if k != "moe_load" or i == holders[-1]}
            for i, r in enumerate(records)]


def _line(step: int | None, load: float | None = None, **extra) -> dict:
    record = {"kind": "train", "loss": 2.0, "moe_max_vio": [0.1], **extra}
    if step is not None:
        record["step"] = step
    if load is not None:
        record["moe_load"] = [[load, 1 - load]]
    return record


SCENARIOS = {  # a step logged again (a resume) by a copy without moe_load
    "newest copy lacks it": [_line(1, 0.1), _line(2, 0.2), _line(2)],
    "two newest lack it": [_line(1, 0.1), _line(2, 0.2), _line(3, 0.3), _line(3), _line(2)],
    "older step re-logged": [_line(1, 0.1), _line(2, 0.2), _line(1)],
    "re-logged with it": [_line(1, 0.1), _line(2, 0.2), _line(2, 0.25)],
    "none survives": [_line(1, 0.1), _line(2), _line(1)],
    "a record without a step": [_line(None, 0.05), _line(1, 0.1), _line(1)],
    "torn and blank lines": [_line(1, 0.1), "", '{"kind": "train", "st', _line(2, 0.2), _line(2)],
}


def test_moe_load_survives_a_newer_copy_of_its_step_that_lacks_it(tmp_path):
    """The reader kept moe_load on the newest line holding it; when that line's step was
    logged again without it, no record held a load, though an earlier surviving one did:
    the report's expert-load table vanished. The newest surviving holder keeps it now."""
    from kiln.report import build_report

    path = tmp_path / "metrics.jsonl"
    for name, lines in SCENARIOS.items():
        path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                                for x in lines))
        assert read_metrics(path) == _newest_holder_only(read_metrics(path, newest_only=())), name
    path.write_text("".join(json.dumps(x) + "\n" for x in SCENARIOS["newest copy lacks it"]))
    assert [r.get("moe_load") for r in read_metrics(path)] == [[[0.1, 0.9]], None]
    (tmp_path / "config.toml").write_text("")
    html = build_report(tmp_path).read_text()
    assert "10.0%" in html and "90.0%" in html  # step 1's shares, the newest left


def test_the_loads_dropped_while_reading_are_not_held(tmp_path):
    """Each demoted record keeps where its line starts, not its load: a 200-record MoE run
    with 54 x 128 loads reads in memory far below the loads' own."""
    path = tmp_path / "metrics.jsonl"
    load = [[1 / 128] * 128] * 54
    with open(path, "w") as f:
        for step in range(1, 201):
            f.write(json.dumps(_record(step) | {"moe_load": load}) + "\n")
    one = _traced_bytes(lambda: json.loads(json.dumps(load)))
    held = _traced_bytes(lambda: read_metrics(path))
    assert held < 3 * one, f"{held / one:.1f} loads held"
