"""yield.json: per-stage documents/bytes in and out add up, reasons are attributed, report shows it."""

import json
from collections import Counter

import pytest
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.formatters.base import BaseFormatter

from kiln.data import pipeline as pl
from kiln.data import stage_registry
from kiln.data.pipeline import PrepareConfig, register_stage, run_prepare
from kiln.data.yield_report import UNATTRIBUTED, add_token_counts, compute_yield, write_yield_report
from kiln.report import build_report

TEXTS = [
    "short",                                 # dropped by min_len (reason "too_short")
    "a long enough document about cats",
    "a long enough document with SECRET",    # dropped by no_secret without a reason
    "another long document about dogs!!",
    "tiny",                                  # too_short
    "a long enough text, ends with !!!!",
]


class MinLength(BaseFilter):
    name = "min length"

    def filter(self, doc):
        return len(doc.text) >= 10 or (False, "too_short")


class NoSecret(BaseFilter):
    name = "no secret"

    def filter(self, doc):
        return "SECRET" not in doc.text  # no reason given


class StripBangs(BaseFormatter):
    name = "strip bangs"

    def format(self, text):
        return text.rstrip("!")


@pytest.fixture
def run(tmp_path):
    saved, saved_f = dict(pl.STAGES), dict(stage_registry._FACTORIES)
    register_stage("min_len", lambda ctx: MinLength())
    register_stage("no_secret", lambda ctx: NoSecret())
    register_stage("strip", lambda ctx: StripBangs())
    src = tmp_path / "src"
    src.mkdir()
    lines = [json.dumps({"text": t}) for t in TEXTS] + ["not json", json.dumps({"x": 1})]
    (src / "a.jsonl").write_text("\n".join(lines[:4]) + "\n")
    (src / "b.jsonl").write_text("\n".join(lines[4:]) + "\n")
    (src / "c.txt").write_bytes(b"caf\xe9 latin")  # latin-1: not UTF-8
    cfg = PrepareConfig(stages=["read", "min_len", "no_secret", "strip", "write"], tasks=2)
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    yield tmp_path / "run"
    pl.STAGES.clear(), pl.STAGES.update(saved)
    stage_registry._FACTORIES.clear(), stage_registry._FACTORIES.update(saved_f)


def _n(texts):
    return sum(len(t.encode()) for t in texts)


def test_numbers_match_a_reference_count(run):
    y = json.loads((run / "yield.json").read_text())
    rows = {r["stage"]: r for r in y["stages"]}
    assert list(rows) == ["read", "min_len", "no_secret", "strip", "write"]
    after_min = [t for t in TEXTS if len(t) >= 10]
    after_secret = [t for t in after_min if "SECRET" not in t]
    stripped = [t.rstrip("!") for t in after_secret]
    assert rows["read"]["documents_in"] == 6 + 3  # bad_json, no_text, non_utf8
    assert rows["read"]["drop_reasons"] == {"bad_json": 1, "no_text": 1, "non_utf8": 1}
    assert (rows["read"]["documents_out"], rows["read"]["bytes_out"]) == (6, _n(TEXTS))
    assert rows["min_len"]["drop_reasons"] == {"too_short": 2}
    assert rows["min_len"]["bytes_out"] == _n(after_min)
    assert rows["no_secret"]["drop_reasons"] == {UNATTRIBUTED: 1}
    assert rows["strip"]["documents_dropped"] == 0
    assert rows["strip"]["bytes_removed"] == _n(after_secret) - _n(stripped) > 0
    assert rows["write"]["documents_out"] == 3 and rows["write"]["bytes_out"] == _n(stripped)
    assert y["documents_in"] == 9 and y["documents_out"] == 3
    assert y["kept_fraction"] == pytest.approx(3 / 9)


def test_in_equals_out_plus_dropped_everywhere(run):
    rows = json.loads((run / "yield.json").read_text())["stages"]
    for prev, row in zip([None, *rows], rows, strict=False):
        assert row["documents_in"] == row["documents_out"] + row["documents_dropped"]
        assert sum(row["drop_reasons"].values()) == row["documents_dropped"]
        if prev is not None:  # a stage reads exactly what the previous one wrote
            assert row["documents_in"] == prev["documents_out"]
            assert row["bytes_in"] == prev["bytes_out"]
            assert row["bytes_in"] - row["bytes_out"] == row["bytes_removed"]


def test_merged_over_tasks_and_rewritten_identically(run):
    before = (run / "yield.json").read_text()
    (run / "yield.json").unlink()
    write_yield_report(run)
    assert (run / "yield.json").read_text() == before


def test_missing_task_stats_are_named(run):
    (run / "logs/prepare/stats/00001.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"task\(s\) \[1\]"):
        write_yield_report(run)


def test_token_counts_and_report_section(run):
    assert add_token_counts(run) is None  # not tokenized yet
    index = {"train": {"documents": 2, "bytes": 50, "tokens": 20},
             "val": {"documents": 1, "bytes": 30, "tokens": 10}, "vocab_size": 300}
    (run / "tokens").mkdir()
    (run / "tokens" / "index.json").write_text(json.dumps(index))
    y = add_token_counts(run)
    assert y["tokenize"] == {"documents": 3, "bytes": 80, "tokens": 30,
                             "bytes_per_token": pytest.approx(80 / 30)}
    html = build_report(run).read_text()
    section = html[html.index("Data yield"):]
    for text in ("min_len", "no_secret", "too_short: 2", "unattributed: 1", "tokenize",
                 "bad_json: 1", "33.3"):
        assert text in section, text


def test_compute_yield_rejects_mismatched_layout():
    layout = {"steps": [{"stage": "read", "meter": True}], "readers": ["read"]}
    with pytest.raises(ValueError, match="steps"):
        compute_yield(layout, [])


def test_report_without_or_with_broken_yield(tmp_path):
    (tmp_path / "prepare.json").write_text("{}")  # a run made before yield.json existed
    assert "Data yield" not in build_report(tmp_path).read_text()  # older runs: no section
    (tmp_path / "yield.json").write_text("{broken")
    assert "yield.json unreadable" in build_report(tmp_path).read_text()


def test_a_last_stage_that_is_not_a_table_costs_its_figures_not_the_report():
    """yield.json edited by hand, its last stage a string: the tokenize row read that
    stage's bytes and the report failed with an AttributeError traceback."""
    from kiln.report.run_files import Loaded
    from kiln.report.sections_yield import yield_section

    html = yield_section(Loaded("yield.json", {"stages": [{"stage": "read"}, "x"],
                                               "tokenize": {"documents": 5, "tokens": 50}}))
    assert "<td>tokenize</td>" in html

def test_report_leaves_out_token_counts_of_other_documents(run):
    """Shards made before a re-prepare: yield.json has no token counts for them, and the
    report does not take them from the stale tokens/index.json either."""
    from kiln.data.provenance import FINGERPRINT_FORMAT

    index = {"train": {"documents": 7, "bytes": 70, "tokens": 21}, "vocab_size": 300,
             "made_from": {"documents": "other", "format": FINGERPRINT_FORMAT}}
    (run / "tokens").mkdir()
    (run / "tokens" / "index.json").write_text(json.dumps(index))
    assert add_token_counts(run) is None
    assert "<td>tokenize</td>" not in build_report(run).read_text()


def test_report_shows_added_documents_and_only_reasons_that_dropped_some():
    """Injected replicas are added, not kept: the inject row reads 100% kept with 19 added
    (not "82 of 63 kept, 130%"), and a reason that dropped nothing is not listed."""
    from kiln.report.run_files import Loaded
    from kiln.report.sections_yield import yield_section

    stages = [{"stage": "read", "documents_in": 63, "documents_out": 63, "documents_added": 0,
               "drop_reasons": {}},
              {"stage": "inject_replicas", "documents_in": 63, "documents_out": 82,
               "documents_added": 19, "drop_reasons": {"replaced_by_replicas": 0}},
              {"stage": "write", "documents_in": 82, "documents_out": 82, "documents_added": 0,
               "drop_reasons": {}}]
    html = yield_section(Loaded("yield.json", {"stages": stages, "documents_in": 63,
                                               "documents_out": 82, "kept_fraction": 82 / 63}))
    assert "replaced_by_replicas" not in html and "130" not in html
    assert "<td>inject_replicas</td><td class=\"num\">63</td><td class=\"num\">19</td>" in html
    assert "63 documents in, 19 added by stages, 82 out" in html
    inject_row = html[html.index("<td>inject_replicas</td>"):].split("</tr>")[0]
    assert "100.0" in inject_row


def test_a_reason_that_dropped_nothing_is_left_out_of_yield():
    layout = {"readers": ["read"], "steps": [
        {"stage": "read", "meter": False}, {"stage": "read", "meter": True},
        {"stage": "inject", "meter": False,
         "reasons": {"prefixes": {}, "keys": {"web_docs_dropped": "replaced_by_replicas"},
                     "added": ["replicas"]}},
        {"stage": "inject", "meter": True}]}
    merged = [{"counts": Counter()}, {"counts": Counter(documents=3, bytes=30)},
              {"counts": Counter(replicas=2, web_docs_dropped=0)},
              {"counts": Counter(documents=5, bytes=50)}]
    rows = compute_yield(layout, merged)["stages"]
    assert rows[1]["drop_reasons"] == {} and rows[1]["documents_added"] == 2


@pytest.mark.parametrize("damage", [b'{"broken\n', b"[1, 2]\n", b"\xff\xfe{}"])
def test_a_damaged_yield_json_does_not_fail_tokenize_after_its_shards(run, damage):
    """`kiln tokenize` adds its counts to yield.json after writing the shards: a yield.json
    edited into bad JSON, a list, or bytes that are not UTF-8 stopped it there with a
    JSONDecodeError / TypeError / UnicodeDecodeError traceback (exit 1, shards written). It
    is left as it was (`kiln report` says it is unreadable)."""
    index = {"train": {"documents": 2, "bytes": 50, "tokens": 20},
             "val": {"documents": 1, "bytes": 30, "tokens": 10}, "vocab_size": 300}
    (run / "tokens").mkdir()
    (run / "tokens" / "index.json").write_text(json.dumps(index))
    (run / "yield.json").write_bytes(damage)
    assert add_token_counts(run) is None
    assert (run / "yield.json").read_bytes() == damage


def test_a_paper_the_latex_stage_refuses_is_attributed():
    """`LatexToText` drops a paper whose \\input fan-out passes the include budget as
    `refused/include_budget`: yield.json listed it as "unattributed"."""
    from kiln.data.arxiv import LatexToText
    from kiln.data.yield_report import reason_spec

    layout = {"readers": ["arxiv_sources"], "steps": [
        {"stage": "arxiv_sources", "meter": True},
        {"stage": "latex", "meter": False, "reasons": reason_spec(LatexToText())},
        {"stage": "latex", "meter": True}]}
    merged = [{"counts": Counter(documents=3, bytes=0)},
              {"counts": Counter({"refused/include_budget": 1, "converted": 2})},
              {"counts": Counter(documents=2, bytes=20)}]
    rows = compute_yield(layout, merged)["stages"]
    assert rows[1]["drop_reasons"] == {"refused_include_budget": 1}
