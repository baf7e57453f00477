"""[prepare] options naming files are recorded absolute: a run's config.toml works from any
folder, and a prepare recorded relative by an older Kiln is still the same pipeline."""

from __future__ import annotations

import json

import pytest

from kiln import cli
from kiln.data.provenance import documents_fingerprint
from kiln.data.yield_report import LAYOUT_FILE

BENCH = {"question": "What is the capital of France and why is it so large a city today",
         "answer": "Paris is the capital because of many historical reasons over centuries"}
SETS = ["--set", 'run.dir="run"', "--set", "data.max_bytes=60000",
        "--set", 'prepare.stages=["read","decontaminate","write"]',
        "--set", 'prepare.decontaminate.benchmarks=["bench.jsonl"]']


@pytest.fixture
def prepared(tmp_path, monkeypatch, capsys):
    (tmp_path / "bench.jsonl").write_text(json.dumps(BENCH) + "\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["prepare", *SETS]) == 0
    capsys.readouterr()
    return tmp_path / "run"


def test_a_run_prepared_with_a_relative_benchmark_prepares_from_another_folder(
        prepared, monkeypatch, capsys):
    """It failed: `file not found: bench.jsonl (from .../sub: .../sub/bench.jsonl)`."""
    assert f'benchmarks = ["{prepared.parent / "bench.jsonl"}"]' in \
        (prepared / "config.toml").read_text()
    (prepared.parent / "sub").mkdir()
    monkeypatch.chdir(prepared.parent / "sub")
    assert cli.main(["prepare", "../run"]) == 0
    assert "prepare: kept" in capsys.readouterr().err


def test_a_signature_recorded_relative_is_the_same_pipeline_from_its_folder(prepared, capsys):
    layout_file = prepared / "logs" / "prepare" / LAYOUT_FILE
    layout = json.loads(layout_file.read_text())
    assert layout["signature"]["decontaminate"]["benchmarks"] == [
        str(prepared.parent / "bench.jsonl")]
    layout["signature"]["decontaminate"]["benchmarks"] = ["bench.jsonl"]  # an older Kiln's
    layout_file.write_text(json.dumps(layout))
    made = documents_fingerprint(prepared)
    assert cli.main(["prepare", *SETS[:-1], 'prepare.decontaminate.benchmarks=["./bench.jsonl"]']) == 0
    assert "prepare: kept" in capsys.readouterr().err
    # recorded as it was: the documents' fingerprint (its shards', checkpoints') stands
    assert json.loads(layout_file.read_text())["signature"]["decontaminate"]["benchmarks"] == [
        "bench.jsonl"]
    assert documents_fingerprint(prepared) == made


def test_every_path_option_is_anchored_and_nothing_else(tmp_path, monkeypatch):
    import dataclasses

    from kiln.data.path_options import PATH_OPTIONS, anchored
    from kiln.data.prepare_config import PrepareConfig

    monkeypatch.chdir(tmp_path)
    cfg = PrepareConfig()
    for table, key in PATH_OPTIONS:
        value = (["a/b.jsonl", "c.jsonl"] if key == "benchmarks" else "kiln:runs/j"
                 if key == "judge" else f"{table}/{key}")
        cfg = dataclasses.replace(cfg, **{table: dataclasses.replace(getattr(cfg, table),
                                                                     **{key: value})})
    out = anchored(cfg)
    assert out.decontaminate.benchmarks == [str(tmp_path / "a/b.jsonl"), str(tmp_path / "c.jsonl")]
    assert out.brain_rot_m2.judge == f"kiln:{tmp_path / 'runs/j'}"
    assert out.arxiv.source_dir == str(tmp_path / "arxiv/source_dir")
    assert out.perplexity.run_dir == str(tmp_path / "perplexity/run_dir")
    changed = {(t, k) for t in vars(cfg) if dataclasses.is_dataclass(getattr(cfg, t))
               for k in vars(getattr(cfg, t)) if getattr(getattr(cfg, t), k) !=
               getattr(getattr(out, t), k)}
    assert changed == set(PATH_OPTIONS)
    assert anchored(PrepareConfig()) == PrepareConfig()  # "" and "heuristic" stay


def test_a_recorded_absolute_judge_run_is_no_data_change(tmp_path, monkeypatch):
    """config.toml records `kiln:runs/j` as `kiln:/abs/runs/j`: the next `kiln run` of the
    same recipe on the trained run compared the two as words and refused ('holds
    checkpoints trained on data made with other settings (prepare.brain_rot_m2.judge ...')."""
    import dataclasses

    from kiln.config import Config, recorded_config
    from kiln.config_changes import data_changes
    from kiln.run_dir import write_run_metadata

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "j").mkdir(parents=True)
    (tmp_path / "bench.jsonl").write_text(json.dumps(BENCH) + "\n")
    base = Config()
    cfg = dataclasses.replace(
        base, run=dataclasses.replace(base.run, dir=str(tmp_path / "run")),
        prepare=dataclasses.replace(
            base.prepare, stages=["read", "decontaminate", "brain_rot_m2", "write"],
            decontaminate=dataclasses.replace(base.prepare.decontaminate,
                                              benchmarks=["bench.jsonl"]),
            brain_rot_m2=dataclasses.replace(base.prepare.brain_rot_m2, judge="kiln:runs/j")))
    write_run_metadata(cfg)
    old = recorded_config(cfg.run_dir)
    assert old.prepare.brain_rot_m2.judge == f"kiln:{tmp_path / 'runs' / 'j'}"
    assert data_changes(old, cfg) == []
    other = dataclasses.replace(cfg, prepare=dataclasses.replace(
        cfg.prepare, brain_rot_m2=dataclasses.replace(cfg.prepare.brain_rot_m2,
                                                      judge="kiln:runs/k")))
    assert [c.split(":")[0] for c in data_changes(old, other)] == ["prepare.brain_rot_m2.judge"]
