"""Hedges' g (`kiln.eval.effect_size`) against a hand-computed example, and in
`kiln report --compare` between two runs' per-window held-out losses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kiln.eval.effect_size import hedges_g
from kiln.eval.window_losses import write_window_losses
from kiln.report import build_report
from kiln.report.effect_sizes import WindowLosses, effect_size_rows


def test_hedges_g_by_hand():
    """a = (2, 4, 6): mean 4, squared deviations 4 + 0 + 4 = 8 (s1^2 = 8/2 = 4).
    b = (1, 2, 3, 4): mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5 (s2^2 = 5/3).
    pooled variance = (2 x 4 + 3 x 5/3) / (3 + 4 - 2) = 13/5 = 2.6, SD = 1.6124515.
    d = (4 - 2.5) / 1.6124515 = 0.9302605; J = 1 - 3 / (4 x 7 - 9) = 16/19 = 0.8421053.
    g = 0.9302605 x 0.8421053 = 0.7833773."""
    assert hedges_g([2, 4, 6], [1, 2, 3, 4]) == pytest.approx(0.7833773, abs=1e-7)
    assert hedges_g([1, 2, 3, 4], [2, 4, 6]) == pytest.approx(-0.7833773, abs=1e-7)
    assert 1.5 / math.sqrt(2.6) * 16 / 19 == pytest.approx(0.7833773, abs=1e-7)


@pytest.mark.parametrize("a,b,said", [
    ([1.0], [1.0, 2.0], "at least 2 values per sample; the first has 1"),
    ([1.0, 2.0], [], "the second has 0"),
    ([3.0, 3.0], [5.0, 5.0, 5.0], "pooled SD 0"),
    ([1.0, math.nan], [1.0, 2.0], "not finite"),
])
def test_hedges_g_refuses_what_has_no_g(a, b, said):
    with pytest.raises(ValueError, match=said):
        hedges_g(a, b)


def eval_run(run: Path, windows: list[float], split_sha: str | None = "a" * 64,
             seq_len: int = 32) -> Path:
    """A run directory with metrics.jsonl and an eval.json whose window losses are `windows`."""
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps(
        {"kind": "train", "step": 1, "loss": 5.0, "lr": 1e-3, "tokens": 100,
         "tokens_per_s": 10.0, "elapsed_s": 0.1}) + "\n")
    record = write_window_losses(run, "val", windows)
    (run / "eval.json").write_text(json.dumps(
        {"split": "val", "loss": float(np.mean(windows)), "perplexity": 1.0, "bpb": 1.0,
         "seq_len": seq_len, "split_sha256": split_sha, "window_losses": record}))
    return run


def test_report_compare_gives_g_between_the_runs_windows(tmp_path):
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0, 4.0])
    worse = eval_run(tmp_path / "worse", [2.0, 4.0, 6.0, 5.0])
    same = eval_run(tmp_path / "same", [1.1, 2.0, 2.9, 4.0])
    with pytest.warns(UserWarning, match="worse's held-out windows have a non-trivially higher"):
        html = build_report(own, compare=[worse, same]).read_text(encoding="utf-8")
    g_worse = hedges_g([2.0, 4.0, 6.0, 5.0], [1.0, 2.0, 3.0, 4.0])
    assert g_worse > 0.3
    assert f"{g_worse:+.3f}</td><td class=\"num\">non-trivial: higher loss</td>" in html
    g_same = hedges_g([1.1, 2.0, 2.9, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert f"{g_same:+.3f}</td><td class=\"num\">trivial</td>" in html


def test_runs_on_other_held_out_windows_get_no_g(tmp_path):
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0])
    other_split = eval_run(tmp_path / "other", [2.0, 3.0, 4.0], split_sha="b" * 64)
    longer = eval_run(tmp_path / "longer", [2.0, 3.0, 4.0], seq_len=64)
    fewer = eval_run(tmp_path / "fewer", [2.0, 3.0])
    unhashed = eval_run(tmp_path / "unhashed", [2.0, 3.0, 4.0], split_sha=None)
    html = build_report(own, compare=[other_split, longer, fewer, unhashed]).read_text(
        encoding="utf-8")
    assert "No Hedges&#x27; g for other against own: not the same held-out split" in html
    assert "No Hedges&#x27; g for longer against own: other windows (64 vs 32 tokens)" in html
    assert "No Hedges&#x27; g for fewer against own: other windows (2 vs 3" in html
    assert "No Hedges&#x27; g for unhashed against own: the token shards do not record" in html
    assert "non-trivial" not in html


def test_a_stale_or_missing_windows_file_is_named(tmp_path):
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0])
    other = eval_run(tmp_path / "other", [2.0, 3.0, 4.0])
    np.save(other / "eval_windows.npy", np.array([9.0, 9.0, 9.0]))  # not the recorded file
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text((own / "metrics.jsonl").read_text())
    (old / "eval.json").write_text(json.dumps({"split": "val", "loss": 1.0}))
    html = build_report(own, compare=[other, old]).read_text(encoding="utf-8")
    assert f"is not the file {other / 'eval.json'} records" in html
    assert "records no per-window losses (from an older `kiln eval`)" in html


def test_effect_size_rows_flag_lower_loss_too():
    a = WindowLosses(np.array([1.0, 2.0, 3.0]), ("val", "h", 32))
    b = WindowLosses(np.array([3.0, 4.0, 5.0]), ("val", "h", 32))
    rows, notes = effect_size_rows(["a", "b"], [b, a])
    assert not notes and rows[0][-1] == "non-trivial: lower loss"
    assert rows[0][-2] == f"{hedges_g([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]):+.3f}"
