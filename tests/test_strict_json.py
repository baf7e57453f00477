"""Kiln's JSON files are strict JSON: a non-finite float (an overflowed perplexity, a
diverged run's nan) is null with a sibling naming it, never the bare Infinity/NaN that
jq and JSON.parse reject, and every Kiln reader reads both that form and the old one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kiln import strict_json
from kiln.atomic import write_json_atomic
from kiln.report.metrics_io import read_metrics
from kiln.train.callbacks import append_jsonl


def strict_loads(text: str):
    """What a strict reader (jq, JSON.parse) does: Infinity and NaN are errors."""
    def refuse(word: str):
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


def same(a, b) -> bool:
    """Equality with nan equal to nan."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


RECORD = {"split": "val", "loss": 800.0, "perplexity": math.inf, "bpb": math.nan,
          "low": -math.inf, "nested": {"x": math.nan, "ok": 1.5}, "name": "inf"}


def _texts_drawn(monkeypatch) -> list[str]:
    """The texts written on the report's plots, gathered as each figure is saved."""
    from matplotlib.figure import Figure

    texts: list[str] = []
    real = Figure.savefig

    def spy(fig, *a, **k):
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return real(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    return texts


def test_write_json_atomic_writes_strict_json_that_reads_back(tmp_path):
    write_json_atomic(tmp_path / "eval.json", RECORD)
    text = (tmp_path / "eval.json").read_text()
    on_disk = strict_loads(text)
    assert on_disk["perplexity"] is None and on_disk["perplexity_not_finite"] == "inf"
    assert on_disk["bpb"] is None and on_disk["bpb_not_finite"] == "nan"
    assert on_disk["low_not_finite"] == "-inf" and on_disk["nested"]["x_not_finite"] == "nan"
    assert same(strict_json.loads(text), RECORD)
    assert same(strict_json.loads(json.dumps(RECORD)), RECORD)  # the old form reads too
    assert strict_json.loads('{"a": null, "a_not_finite": "bogus"}') == {
        "a": None, "a_not_finite": "bogus"}  # only a named non-finite value is restored


def test_metrics_lines_are_strict_and_read_back_old_and_new(tmp_path):
    records = [{"kind": "train", "step": 1, "loss": 4.0, "grad_norm": math.inf},
               {"kind": "val", "step": 1, "val_loss": 3.0, "val_bpb": math.nan}]
    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    for r in records:
        append_jsonl(new, r)
    old.write_text("".join(json.dumps(r) + "\n" for r in records))
    for line in new.read_text().splitlines():
        strict_loads(line)
    assert same(read_metrics(new), records) and same(read_metrics(old), records)


@pytest.mark.parametrize("form", ["old", "new"])
def test_the_report_reads_both_forms_alike(tmp_path, form, monkeypatch):
    """The report's eval table and its plots' non-finite notes from either form."""
    from kiln.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "train", "step": s, "loss": v, "lr": 1e-3}
               for s, v in enumerate([4.0, 3.5, math.inf], start=1)]
    records.append({"kind": "val", "step": 2, "val_loss": 3.0, "val_bpb": math.nan})
    evaluation = {"split": "val", "loss": 800.0, "perplexity": math.inf, "bpb": math.nan}
    if form == "old":
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run / "eval.json").write_text(json.dumps(evaluation))
    else:  # the new form as such (the writers are tested above)
        (run / "metrics.jsonl").write_text("".join(strict_json.dumps(r) + "\n" for r in records))
        (run / "eval.json").write_text(strict_json.dumps(evaluation))
    texts = _texts_drawn(monkeypatch)
    page = build_report(run).read_text(encoding="utf-8")
    assert "<td>inf (exp of a loss above 709.78 overflows a float)</td>" in page
    assert "train loss: 1 non-finite point not drawn (first inf at step 3)" in "\n".join(texts)
    assert "val bits/byte: 1 non-finite point not drawn (first nan at step 2)" in texts


def test_a_stored_infinite_perplexity_threshold_reads_back(tmp_path: Path):
    """The prepare stage's thresholds file: a band whose top is inf (documents whose
    perplexity overflowed) keeps working once written strictly."""
    from datatrove.data import Document

    from kiln.data.filters.selection import StoredThresholdSelector

    write_json_atomic(tmp_path / "thresholds.json",
                      {"mode": "drop_extremes", "scores": 3, "low": 2.0, "high": math.inf})
    strict_loads((tmp_path / "thresholds.json").read_text())
    select = StoredThresholdSelector("drop_extremes", tmp_path / "thresholds.json")
    doc = Document(text="x", id="0", metadata={"ppl": 1e300})
    assert select.filter(doc) is True


LISTS = {"moe_max_vio": [0.5, math.nan, 1.0], "moe_load": [[0.5, 0.5], [math.inf, -math.inf]],
         "pairs": (math.nan, 2.0), "rows": [{"x": math.nan}, [1.0, math.inf]], "ok": [1.0],
         "name": ["nan", "inf"]}


def test_non_finite_floats_in_lists_read_back(tmp_path):
    """A nan or inf inside a list was written as null alone: readers got None back, and the
    report could neither restore nor note it. Now its sibling names it by its place."""
    write_json_atomic(tmp_path / "eval.json", LISTS)
    text = (tmp_path / "eval.json").read_text()
    on_disk = strict_loads(text)
    assert on_disk["moe_max_vio"] == [0.5, None, 1.0]
    assert on_disk["moe_max_vio_not_finite"] == {"1": "nan"}
    assert on_disk["moe_load_not_finite"] == {"1.0": "inf", "1.1": "-inf"}
    assert on_disk["rows_not_finite"] == {"1.1": "inf"} and on_disk["rows"][0]["x_not_finite"] == "nan"
    assert "ok_not_finite" not in on_disk and "name_not_finite" not in on_disk
    expected = {**LISTS, "pairs": [math.nan, 2.0]}
    assert same(strict_json.loads(text), expected)
    assert same(strict_json.loads(json.dumps(LISTS)), expected)  # the bare words read too
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"kind": "train", "step": 1, **LISTS})
    assert same(read_metrics(path, newest_only=()), [{"kind": "train", "step": 1, **expected}])


@pytest.mark.parametrize("text", [
    '{"a": [null, 1.0], "a_not_finite": {"1": "nan"}}',  # names a place that is not null
    '{"a": [null], "a_not_finite": {"0": "nan", "1": "inf"}}',  # a place past the end
    '{"a": [null], "a_not_finite": {"0": "bogus"}}',
    '{"a": [null], "a_not_finite": {"0.0": "nan"}}',  # deeper than the list
    '{"a": [null], "a_not_finite": {"-0": "nan"}}',
    '{"a": [null], "a_not_finite": {}}',
    '{"a": [null], "a_not_finite": ["nan"]}',
    '{"a": null, "a_not_finite": []}',  # not a word: a TypeError (unhashable) before
    '{"a": null, "a_not_finite": {"0": "nan"}}',
    '[null]',
])
def test_a_sibling_that_does_not_fit_is_left_as_it_is(text):
    assert strict_json.loads(text) == json.loads(text)


def test_the_report_notes_a_non_finite_point_inside_a_list(tmp_path, monkeypatch):
    """A MoE layer's MaxVio that is nan: drawn as a gap and noted on the plot, and an
    expert's load that is not a number shown as such, not a TypeError from the report."""
    from kiln.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "train", "step": s, "loss": 4.0, "lr": 1e-3, "moe_max_vio": [0.1, v],
                "moe_load": [[0.5, 0.5], [w, 0.25]]}
               for s, v, w in [(1, 0.2, 0.75), (2, math.nan, math.nan)]]
    (run / "metrics.jsonl").write_text("".join(strict_json.dumps(r) + "\n" for r in records))
    texts = _texts_drawn(monkeypatch)
    page = build_report(run).read_text(encoding="utf-8")
    assert "MoE layer 1: 1 non-finite point not drawn (first nan at step 2)" in texts
    assert '<td class="num">nan</td><td class="num">25.0%</td>' in page
    old = records[-1] | {"moe_load": [[0.5, 0.5], [None, 0.25]], "moe_max_vio": [0.1, None]}
    (run / "metrics.jsonl").write_text(json.dumps(old) + "\n")  # an older Kiln's null alone
    page = build_report(run).read_text(encoding="utf-8")
    assert '<td class="num">—</td><td class="num">25.0%</td>' in page


def test_a_text_without_a_sibling_key_is_not_walked(monkeypatch):
    """Restoring walks every value of a record (an MoE run's 54 x 128 load: 40% of the time
    to read its metrics); a text that names no non-finite float skips it, and one that can
    still name one (an escaped key) does not."""
    walked = []
    real = strict_json.restore_non_finite
    monkeypatch.setattr(strict_json, "restore_non_finite", lambda v: walked.append(v) or real(v))
    plain = json.dumps({"moe_load": [[0.5, 0.5]] * 3, "loss": math.nan, "x": "é"},
                       ensure_ascii=False)
    assert same(strict_json.loads(plain), json.loads(plain)) and not walked
    escaped = '{"a": null, "a_not_finit\\u0065": "inf", "b": [null], "b_not_finite": {"0": "nan"}}'
    assert same(strict_json.loads(escaped), {"a": math.inf, "b": [math.nan]}) and walked
    assert same(strict_json.loads(escaped.encode()), {"a": math.inf, "b": [math.nan]})


def test_a_key_already_named_as_a_sibling_is_refused():
    """`{"loss": nan, "loss_not_finite": "x"}` written as before read back with the user's
    key taken for the sibling (and the value lost to it): such a pair is refused instead,
    naming both keys, at any depth; either key alone still writes."""
    with pytest.raises(ValueError, match="'loss' and 'loss_not_finite'"):
        strict_json.dumps({"loss": math.nan, "loss_not_finite": "x"})
    with pytest.raises(ValueError, match="'a' and 'a_not_finite'"):
        strict_json.dumps({"outer": [{"a": None, "a_not_finite": "nan"}]})
    assert strict_json.loads(strict_json.dumps({"loss_not_finite": "x"})) == {"loss_not_finite": "x"}
