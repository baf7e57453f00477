"""Hedges' g and the paired difference (`kiln.eval.effect_size`) against hand-computed
examples, and in `kiln report --compare` between two runs' per-window held-out losses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kiln.eval.effect_size import hedges_g, paired_difference, t_quantile
from kiln.eval.window_losses import write_window_losses
from kiln.report import build_report
from kiln.report.effect_sizes import COLUMNS, WindowLosses, effect_size_rows


def test_hedges_g_by_hand():
    """a = (2, 4, 6): mean 4, squared deviations 4 + 0 + 4 = 8 (s1^2 = 8/2 = 4).
    b = (1, 2, 3, 4): mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5 (s2^2 = 5/3).
    pooled variance = (2 x 4 + 3 x 5/3) / (3 + 4 - 2) = 13/5 = 2.6, SD = 1.6124515.
    d = (4 - 2.5) / 1.6124515 = 0.9302605; J = 1 - 3 / (4 x 7 - 9) = 16/19 = 0.8421053.
    g = 0.9302605 x 0.8421053 = 0.7833773."""
    assert hedges_g([2, 4, 6], [1, 2, 3, 4]) == pytest.approx(0.7833773, abs=1e-7)
    assert hedges_g([1, 2, 3, 4], [2, 4, 6]) == pytest.approx(-0.7833773, abs=1e-7)
    assert 1.5 / math.sqrt(2.6) * 16 / 19 == pytest.approx(0.7833773, abs=1e-7)


def test_paired_difference_by_hand():
    """a = (3, 5, 4, 6), b = (1, 2, 2, 3): differences (2, 3, 2, 3), mean 2.5, squared
    deviations 4 x 0.25 = 1, s^2 = 1/3, s = 0.5773503, s / sqrt(4) = 0.2886751; t(0.975, 3)
    = 3.1824463 (tables), half-width 3.1824463 x 0.2886751 = 0.9186930: [1.5813070,
    3.4186930]; d_z = 2.5 / 0.5773503 = 4.3301270. (Hedges' g of the same numbers, which
    ignores the pairing: (4.5 - 2) / sqrt((5 + 2) / 6) x (1 - 3/23) = 2.0126524, under half d_z.)"""
    got = paired_difference([3, 5, 4, 6], [1, 2, 2, 3])
    assert got.n == 4 and got.mean == pytest.approx(2.5)
    assert got.low == pytest.approx(1.5813070, abs=1e-6)
    assert got.high == pytest.approx(3.4186930, abs=1e-6)
    assert got.d_z == pytest.approx(4.3301270, abs=1e-6)
    assert hedges_g([3, 5, 4, 6], [1, 2, 2, 3]) == pytest.approx(2.0126524, abs=1e-6)
    swapped = paired_difference([1, 2, 2, 3], [3, 5, 4, 6])
    assert (swapped.mean, swapped.low, swapped.d_z) == pytest.approx((-2.5, -3.4186930,
                                                                      -4.3301270), abs=1e-6)
    same = paired_difference([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])  # every window 0.5 apart
    assert same.d_z is None and same.low == same.high == pytest.approx(0.5)


@pytest.mark.parametrize("df,t", [(1, 12.706205), (2, 4.302653), (3, 3.182446),
                                  (10, 2.228139), (30, 2.042272), (120, 1.979930),
                                  (1000, 1.962339), (1001, 1.962337), (10**6, 1.959966)])
def test_t_quantile_matches_the_tables(df, t):
    assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-6)


@pytest.mark.parametrize("a,b,said", [
    ([1.0, 2.0], [1.0], "as many values in each sample; 2 vs 1"),
    ([1.0], [2.0], "at least 2 pairs"),
    ([1.0, math.inf], [1.0, 2.0], "not finite"),
])
def test_paired_difference_refuses_what_has_none(a, b, said):
    with pytest.raises(ValueError, match=said):
        paired_difference(a, b)


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


def test_report_compare_gives_the_paired_view_beside_g(tmp_path, capsys):
    """The same windows, so the paired figures stand beside g, in the table and on the
    printed line: worse - own = (1, 2, 3, 1), mean 1.75, s = 0.9574271, t(0.975, 3) s / 2 =
    1.5234803: [0.2265197, 3.2734803], d_z = 1.75 / 0.9574271 = 1.8278154."""
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0, 4.0])
    worse = eval_run(tmp_path / "worse", [2.0, 4.0, 6.0, 5.0])
    with pytest.warns(UserWarning, match=r"paired mean difference \[95% CI\] \+1.7500 "
                      r"\[\+0.2265, \+3.2735\] nats"):
        html = build_report(own, compare=[worse]).read_text(encoding="utf-8")
    g = hedges_g([2.0, 4.0, 6.0, 5.0], [1.0, 2.0, 3.0, 4.0])
    cells = "".join(f"<td class=\"num\">{c}</td>" for c in (
        "+1.7500 [+0.2265, +3.2735]", "+1.828", f"{g:+.3f}", "non-trivial: higher loss"))
    assert cells in html and "mean difference [95% CI]" in html and "d_z" in html
    out = capsys.readouterr().out
    assert (f"--compare: worse against own over 4 windows: Hedges' g {g:+.3f} (non-trivial: "
            "higher loss); paired mean loss difference [95% CI] +1.7500 [+0.2265, +3.2735] "
            "nats, d_z +1.828") in out
    assert COLUMNS[-2:] == ["Hedges' g", "verdict"]


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


def test_records_of_other_json_types_cost_the_comparison_not_the_report(tmp_path):
    """eval.json's split_sha256 as an object, or index.json's seed as a list (edited by
    hand): `hash[:12]` and the grouping of runs by their data failed the report with a
    TypeError traceback; such a hash is no hash, and such a seed compares as any other."""
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0])
    odd = eval_run(tmp_path / "odd", [2.0, 3.0, 4.0], split_sha={"a": 1})  # type: ignore[arg-type]
    seeded = eval_run(tmp_path / "seeded", [2.0, 3.0, 4.0], split_sha="b" * 64)
    for run, seed in ((own, 0), (seeded, [])):
        (run / "tokens").mkdir()
        (run / "tokens/index.json").write_text(json.dumps({
            "val_fraction": 0.05, "seed": seed,
            "made_from": {"documents": "d" * 64, "format": 3, "tokenizer": ["t"]}}))
    with pytest.warns(UserWarning, match="validation data differ"):
        html = build_report(own, compare=[odd, seeded]).read_text(encoding="utf-8")
    assert "No Hedges&#x27; g for odd against own: the token shards do not record" in html
    assert "No Hedges&#x27; g for seeded against own: not the same held-out split" in html

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


def test_a_run_with_losses_not_finite_is_named(tmp_path):
    """g's error named "the first" or "the second" sample: which run diverged was left to
    guess. The note names the run, and how many of its windows."""
    own = eval_run(tmp_path / "own", [1.0, 2.0, 3.0])
    nan = eval_run(tmp_path / "nan", [1.0, 2.0, math.nan])
    inf = eval_run(tmp_path / "inf", [1.0, math.inf, math.inf])
    html = build_report(own, compare=[nan, inf]).read_text(encoding="utf-8")
    assert ("No Hedges&#x27; g for nan against own: nan: 1 of its 3 per-window losses are not "
            "finite (NaN or inf)") in html
    assert "No Hedges&#x27; g for inf against own: inf: 2 of its 3" in html
    assert "sample holds" not in html
    html = build_report(nan, compare=[own]).read_text(encoding="utf-8")
    assert "No Hedges&#x27; g for own against nan: nan: 1 of its 3" in html


def test_effect_size_rows_flag_lower_loss_too():
    a = WindowLosses(np.array([1.0, 2.0, 3.0]), ("val", "h", 32))
    b = WindowLosses(np.array([3.0, 4.0, 5.0]), ("val", "h", 32))
    rows, notes = effect_size_rows(["a", "b"], [b, a])
    assert not notes and rows[0][-1] == "non-trivial: lower loss"
    assert rows[0][-2] == f"{hedges_g([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]):+.3f}"
