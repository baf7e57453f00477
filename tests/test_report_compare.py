"""`kiln report RUN --compare OTHER`: overlay plot, comparison table, and the MoE section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.config import Config, ConfigError, config_to_toml
from kiln.report import build_report
from kiln.report.plots import max_vio_series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(run: Path, losses: list[float], bpbs: list[float], params: int, active: int,
             tokens_per_s: float, max_vio: list[list[float]] | None = None) -> Path:
    """A run directory with metrics.jsonl (train every step, val every 4), model.json and a
    config.toml whose model has a 2-layer dense prefix."""
    run.mkdir(parents=True)
    records = []
    for step, loss in enumerate(losses, start=1):
        r = {"kind": "train", "step": step, "loss": loss, "lr": 1e-3, "tokens": step * 100,
             "tokens_per_s": tokens_per_s, "elapsed_s": step * 0.1}
        if max_vio is not None:
            r["moe_max_vio"] = max_vio[step - 1]
        records.append(r)
    for i, bpb in enumerate(bpbs, start=1):
        records.append({"kind": "val", "step": 4 * i, "val_loss": bpb, "val_bpb": bpb})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "model.json").write_text(json.dumps({"params": params, "params_active": active}))
    cfg = Config()
    cfg.model.n_dense_layers = 2
    (run / "config.toml").write_text(config_to_toml(cfg))
    return run


@pytest.fixture
def runs(tmp_path):
    vio = [[3.0 - 0.3 * s, 2.0 - 0.2 * s] for s in range(8)]  # 2 MoE layers, 8 steps
    trinity = make_run(tmp_path / "trinity", [5.0, 4.5, 4.2, 4.0, 3.9, 3.8, 3.75, 3.7],
                       [2.5, 2.2], 3_072_640, 2_040_448, 3000.0, vio)
    dense = make_run(tmp_path / "dense", [5.0, 4.6, 4.4, 4.3, 4.2, 4.1, 4.05, 4.0],
                     [2.6, 2.4], 2_041_984, 2_041_984, 5000.0)
    return trinity, dense


def test_compare_section_table_and_plot(runs):
    trinity, dense = runs
    html = build_report(trinity, compare=[dense]).read_text()
    assert (trinity / "plots" / "compare_loss.png").read_bytes().startswith(PNG_MAGIC)
    table = html.split("<h2>Comparison</h2>", 1)[1].split("</section>", 1)[0]
    rows = [r for r in table.split("<tr>")[2:]]
    assert len(rows) == 2 and ">trinity<" in rows[0] and ">dense<" in rows[1]
    for cell in ("3.7000", "2.2000", "3.1M", "2.0M", "3.0K"):  # final loss, best bpb, ...
        assert cell in rows[0], (cell, rows[0])
    for cell in ("4.0000", "2.4000", "5.0K"):
        assert cell in rows[1], (cell, rows[1])


def test_moe_section_plot_and_final_values(runs):
    trinity, dense = runs
    html = build_report(trinity).read_text()
    assert (trinity / "plots" / "moe_max_vio.png").read_bytes().startswith(PNG_MAGIC)
    moe = html.split("Mixture of experts: load balance", 1)[1].split("</section>", 1)[0]
    # layer 0 sits in block 2 (after the dense prefix); final 3.0 - 0.3 * 7 = 0.9; the last
    # quarter (steps 7, 8) averages (1.2 + 0.9) / 2 = 1.05
    assert "<td>MoE layer 0</td><td class=\"num\">2</td><td class=\"num\">0.900</td>" \
           "<td class=\"num\">1.050</td>" in moe
    assert "<td>MoE layer 1</td><td class=\"num\">3</td><td class=\"num\">0.600</td>" in moe
    assert "Comparison" not in html  # no --compare, no comparison
    dense_html = build_report(dense).read_text()
    assert "Mixture of experts" not in dense_html
    assert not (dense / "plots" / "moe_max_vio.png").exists()


def test_max_vio_series_per_layer():
    records = [{"kind": "train", "step": 2, "moe_max_vio": [0.5, 0.25]},
               {"kind": "train", "step": 1, "moe_max_vio": [1.0, None]},
               {"kind": "train", "step": 3}]
    lines = max_vio_series(sorted(records, key=lambda r: r["step"]))
    assert [(s.steps, s.values) for s in lines] == [([1, 2], [1.0, 0.5]), ([2], [0.25])]


def test_missing_compare_run_fails_before_writing(runs, tmp_path):
    trinity, _ = runs
    before = build_report(trinity).read_text()
    with pytest.raises(ConfigError, match="no_such_run"):  # a typo: exit status 2, as a target's
        build_report(trinity, compare=[tmp_path / "no_such_run"])
    assert (trinity / "report.html").read_text() == before


def test_cli_report_compare(runs, tmp_path, capsys):
    trinity, dense = runs
    assert main(["report", str(trinity), "--compare", str(dense)]) == 0
    assert "Comparison" in (trinity / "report.html").read_text()
    assert main(["report", str(trinity), "--compare", str(tmp_path / "missing")]) == 2
    assert "--compare" in capsys.readouterr().err
    (trinity / "report.html").unlink()
    assert main(["report", "--compare", str(dense), str(trinity)]) == 0  # RUN after the flag
    assert "Comparison" in (trinity / "report.html").read_text()


def test_comparing_with_a_run_not_trained_yet_says_so(runs, tmp_path, capsys):
    """A prepared run, not yet trained, was refused as if it were no Kiln run at all."""
    trinity, _ = runs
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "config.toml").write_text(config_to_toml(Config()))
    assert main(["report", str(trinity), "--compare", str(prepared)]) == 1
    err = capsys.readouterr().err
    assert f"cannot compare with {prepared}: metrics.jsonl missing (a run not trained yet: " \
        "`kiln train` it first)" in err
    (tmp_path / "other").mkdir()  # no run at all: the user's argument to fix
    assert main(["report", str(trinity), "--compare", str(tmp_path / "other")]) == 2
    assert "is not a Kiln run directory (no config.toml or metrics.jsonl)" in \
        capsys.readouterr().err


def test_a_run_compared_with_itself_is_refused(runs, capsys):
    trinity, dense = runs
    for compare in ([str(trinity)], [str(dense), f"{dense}/"]):
        args = [x for c in compare for x in ("--compare", c)]
        assert main(["report", str(trinity), *args]) == 2
        assert "again: each run once" in capsys.readouterr().err


def test_a_compare_path_that_does_not_exist_is_refused_as_a_missing_target_is(runs, tmp_path,
                                                                           capsys):
    """`kiln report RUN --compare typo` said 'metrics.jsonl missing (expected a Kiln run
    directory)' and exited 1, where `kiln report typo` says there is nothing there and exits
    2: a path given on the command line that names nothing is the user's to fix."""
    trinity, _ = runs
    missing = tmp_path / "typo"
    assert main(["report", str(trinity), "--compare", str(missing)]) == 2
    assert capsys.readouterr().err == (f"kiln: config error: --compare {missing}: nothing is "
                                       "there; give a Kiln run directory\n")
    assert not (trinity / "report.html").exists()  # refused before any work
    assert main(["report", str(missing)]) == 2
    missing.mkdir()  # a folder, but no run
    assert main(["report", str(trinity), "--compare", str(missing)]) == 2
    assert f"--compare {missing} is not a Kiln run directory" in capsys.readouterr().err


def test_same_named_runs_get_distinct_labels(tmp_path):
    a = make_run(tmp_path / "x" / "run", [4.0], [], 10, 10, 1.0)
    b = make_run(tmp_path / "y" / "run", [3.0], [], 10, 10, 1.0)
    html = build_report(a, compare=[b]).read_text()
    assert ">x/run<" in html and ">y/run<" in html


def test_runs_sharing_parent_and_name_get_the_shortest_distinct_suffixes(tmp_path):
    """/x/a/run and /y/a/run: the parent alone does not tell them apart."""
    a = make_run(tmp_path / "x" / "a" / "run", [4.0], [], 10, 10, 1.0)
    b = make_run(tmp_path / "y" / "a" / "run", [3.0], [], 10, 10, 1.0)
    c = make_run(tmp_path / "z" / "other", [3.0], [], 10, 10, 1.0)
    html = build_report(a, compare=[b, c]).read_text()
    assert ">x/a/run<" in html and ">y/a/run<" in html and ">other<" in html


def test_moe_section_shows_last_expert_load(tmp_path):
    run = make_run(tmp_path / "moe", [5.0, 4.0], [2.5], 10, 5, 100.0, [[1.0], [0.5]])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[1])
    last["moe_load"] = [[0.375, 0.125, 0.25, 0.25]]
    lines[1] = json.dumps(last)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    moe = build_report(run).read_text().split("Mixture of experts: load balance", 1)[1]
    assert "uniform is 25.0% per expert" in moe
    cells = "".join(f"<td class=\"num\">{v}</td>" for v in ("37.5%", "12.5%", "25.0%", "25.0%"))
    assert "<td>MoE layer 0 (block 2)</td>" + cells in moe


def test_run_names_are_plain_text_in_the_legend(tmp_path, monkeypatch):
    """A folder name is a label, not matplotlib markup: `$` must not start mathtext (which
    can fail to parse) and a leading `_` must not hide the run from the legend."""
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (saved.append(self),
                                                                   real_savefig(self, *a, **k)))
    a = make_run(tmp_path / "cost$1k_vs_$2k", [4.0, 3.5], [2.0], 10, 10, 1.0)
    b = make_run(tmp_path / "_ablation", [4.1, 3.6], [2.1], 10, 10, 1.0)
    build_report(a, compare=[b])
    [fig] = [f for f in saved if len(f.axes) == 2]  # the comparison's two panels
    for ax in fig.axes:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert texts == [r"cost\$1k_vs_\$2k", "_ablation"]


def _index(run: Path, tokenizer: str, documents: str, val_fraction: float = 0.05,
           fmt: int = 3) -> None:
    (run / "tokens").mkdir(exist_ok=True)
    (run / "tokens/index.json").write_text(json.dumps({
        "val_fraction": val_fraction, "seed": 0,
        "made_from": {"documents": documents, "format": fmt, "tokenizer": tokenizer}}))


def test_runs_with_other_tokenizers_or_val_data_are_compared_with_a_warning(runs, capsys):
    """Loss per token of another tokenizer, or bpb on other text, is not the same axis."""
    trinity, dense = runs
    _index(trinity, "tok-a", "docs-a")
    _index(dense, "tok-a", "docs-a")
    assert main(["report", str(trinity), "--compare", str(dense)]) == 0
    assert "warning" not in capsys.readouterr().err  # same data: nothing to say
    assert "Note:" not in (trinity / "report.html").read_text()

    _index(dense, "tok-b", "docs-a", val_fraction=0.1)
    assert main(["report", str(trinity), "--compare", str(dense)]) == 0
    err = capsys.readouterr().err
    assert "warning: --compare: the runs' tokenizers differ" in err and "(trinity vs dense)" in err
    assert "validation data differ" in err
    html = (trinity / "report.html").read_text()
    assert html.count("Note: the runs&#x27;") + html.count("Note: the runs'") == 2


def test_shards_recorded_in_another_fingerprint_format_compare_by_their_documents(runs, capsys):
    """A run tokenized before the documents' fingerprint took its format 4 (format 3) and
    one after, from the same documents, hold the same validation data: no warning. Other
    documents than the format-3 record's still warn."""
    from kiln.data.provenance import documents_fingerprint
    from kiln.data.yield_report import LAYOUT_FILE

    for run in runs:
        (run / "logs" / "prepare").mkdir(parents=True, exist_ok=True)
        (run / "prepare.json").write_text(json.dumps(
            {"documents": 3, "bytes": 30, "stages": ["read", "perplexity", "write"]}))
        (run / "logs" / "prepare" / LAYOUT_FILE).write_text(json.dumps({"signature": {
            "stages": ["read", "perplexity", "write"], "perplexity_scored_tokens": "max_seq_len",
            "input_files": {"a.txt": {"size": 3, "sha256": "cd"}}}}))
    trinity, dense = runs
    assert documents_fingerprint(trinity, 3) != documents_fingerprint(trinity)
    _index(trinity, "tok-a", documents_fingerprint(trinity), fmt=4)
    _index(dense, "tok-a", documents_fingerprint(dense, 3), fmt=3)
    assert main(["report", str(trinity), "--compare", str(dense)]) == 0
    assert "warning" not in capsys.readouterr().err

    _index(dense, "tok-a", "other-documents", fmt=3)
    assert main(["report", str(trinity), "--compare", str(dense)]) == 0
    assert "validation data differ" in capsys.readouterr().err


def test_report_with_compare_reads_each_metrics_file_once(runs, monkeypatch):
    """The report and its comparison both need RUN's records: metrics.jsonl (gigabytes in a
    long run) was read twice, once for each; now once per run."""
    import kiln.report.run_files as run_files

    trinity, dense = runs
    reads = []
    real = run_files.read_metrics
    monkeypatch.setattr(run_files, "read_metrics",
                        lambda path: reads.append(Path(path).parent.name) or real(path))
    html = build_report(trinity, compare=[dense]).read_text()
    assert sorted(reads) == ["dense", "trinity"]
    assert "<h2>Comparison</h2>" in html and "3.7000" in html  # the same figures as before


def test_a_run_folder_named_in_bytes_that_are_not_utf8_is_compared(tmp_path):
    """Python holds such a name as lone surrogates, which matplotlib cannot draw and a UTF-8
    page cannot hold: the report raised a traceback; the label shows the byte as \\xff."""
    a = make_run(tmp_path / "a", [4.0, 3.5], [2.0], 10, 10, 1.0)
    b = make_run(tmp_path / os.fsdecode(b"run\xff"), [4.1, 3.6], [2.1], 10, 10, 1.0)
    html = build_report(a, compare=[b]).read_text(encoding="utf-8")
    assert "<td>run\\xff</td>" in html


def test_a_config_whose_model_is_not_a_table_costs_the_moe_blocks_not_the_report(tmp_path):
    """config.toml edited to `model = "x"`: the MoE section read model.n_dense_layers from
    it and the report failed with an AttributeError traceback."""
    run = make_run(tmp_path / "moe", [5.0, 4.0], [2.5], 10, 5, 100.0, [[1.0], [0.5]])
    (run / "config.toml").write_text('model = "x"\n')
    html = build_report(run).read_text()
    assert "<td>MoE layer 0</td><td class=\"num\">0</td>" in html
