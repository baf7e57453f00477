"""The prepare pipeline: stage registry, builder, task sharding, resume, executors, errors."""

import json
import os

import pytest
from datatrove.pipeline.filters.base_filter import BaseFilter

from kiln.config import ConfigError
from kiln.data import pipeline as pl
from kiln.data import prepare_executor, stage_registry
from kiln.data.documents import read_documents
from kiln.data.pipeline import (
    PrepareConfig,
    StageUnavailableError,
    build_pipeline,
    make_executor,
    register_stage,
    run_prepare,
)


class DropContaining(BaseFilter):
    """Drops documents containing `needle`, with that reason."""

    name = "drop containing"

    def __init__(self, needle: str, reason: str):
        super().__init__()
        self.needle, self.reason = needle, reason

    def filter(self, doc):
        return (False, self.reason) if self.needle in doc.text else True


@pytest.fixture
def registry():
    """Register test stages; restore the registry afterwards."""
    saved, saved_f = dict(pl.STAGES), dict(stage_registry._FACTORIES)
    register_stage("no_spam", lambda ctx: DropContaining("spam", "spam"))
    yield
    pl.STAGES.clear(), pl.STAGES.update(saved)
    stage_registry._FACTORIES.clear(), stage_registry._FACTORIES.update(saved_f)


def corpus(root, n=7):
    src = root / "src"
    src.mkdir()
    for i in range(n):
        body = f"document {i} " + ("spam " if i % 3 == 0 else "") + "x" * (i * 10)
        (src / f"f{i}.txt").write_text(body)
    (src / "g.jsonl").write_text('{"text": "json one"}\n{"text": "spam json"}\nbroken\n')
    return src


def _docs(run_dir):
    return sorted((d.id, d.text) for d in read_documents(run_dir))


def _cfg(**kw):
    return PrepareConfig(stages=["read", "no_spam", "write"], **kw)


def test_one_and_two_tasks_same_output(tmp_path, registry):
    src = corpus(tmp_path)
    s1 = run_prepare(_cfg(tasks=1), tmp_path / "a", [str(src)], progress=False)
    s2 = run_prepare(_cfg(tasks=2), tmp_path / "b", [str(src)], progress=False)
    assert _docs(tmp_path / "a") == _docs(tmp_path / "b")
    assert len(_docs(tmp_path / "a")) == 5  # 8 docs read, 3 contain spam
    assert sorted(p.name for p in (tmp_path / "b" / "documents").iterdir()) == [
        "00000.jsonl.gz", "00001.jsonl.gz"]
    for key in ("documents", "bytes", "skipped", "documents_out", "bytes_out"):
        assert s1[key] == s2[key], key
    y1 = json.loads((tmp_path / "a" / "yield.json").read_text())
    y2 = json.loads((tmp_path / "b" / "yield.json").read_text())
    assert y1["stages"] == y2["stages"] and y2["tasks"] == 2


def test_two_worker_processes(tmp_path):
    src = corpus(tmp_path)
    cfg = PrepareConfig(stages=["read", "write"], tasks=2, workers=2)
    summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    assert summary["documents"] == summary["documents_out"] == 9
    assert len(_docs(tmp_path / "run")) == 9


def test_resume_skips_completed_tasks_and_redo_does_not(tmp_path, registry):
    src = corpus(tmp_path)
    run = tmp_path / "run"
    cfg = _cfg(tasks=2)
    run_prepare(cfg, run, [str(src)], progress=False)
    # task 1 "crashed": no completion marker, no stats; task 0's output file is stamped with
    # an old time, as a probe of which tasks re-run
    (run / "logs/prepare/completions/00001").unlink()
    (run / "logs/prepare/stats/00001.json").unlink()
    out0, out1 = (run / "documents" / f"0000{i}.jsonl.gz" for i in (0, 1))
    for out in (out0, out1):
        os.utime(out, ns=(out.stat().st_atime_ns, 10**18))
    before = dict(_docs(run))
    run_prepare(cfg, run, [str(src)], progress=False)
    assert out0.stat().st_mtime_ns == 10**18  # task 0 skipped
    assert out1.stat().st_mtime_ns != 10**18  # task 1 re-ran
    assert dict(_docs(run)) == before
    run_prepare(cfg, run, [str(src)], redo=True, progress=False)
    assert out0.stat().st_mtime_ns != 10**18
    # an edit that keeps the size and the time is still a changed input: no resume
    f0 = src / "f0.txt"  # f0 is file 0 -> task 0; "document 0 spam " was dropped as spam
    st = f0.stat()
    f0.write_text("document 0 fresh")  # same length
    os.utime(f0, ns=(st.st_atime_ns, st.st_mtime_ns))
    run_prepare(cfg, run, [str(src)], progress=False)
    assert dict(_docs(run))["src/f0.txt"] == "document 0 fresh"
    # a changed pipeline never resumes a stale run
    summary = run_prepare(PrepareConfig(stages=["read", "write"], tasks=2), run, [str(src)],
                          progress=False)
    assert summary["stages"] == ["read", "write"] and summary["documents_out"] == 9


def test_missing_stage_module_is_named(tmp_path, registry):
    register_stage("ghost", "kiln.data.no_such_stage_module:ghost_stage")
    cfg = PrepareConfig(stages=["read", "ghost", "write"])
    with pytest.raises(StageUnavailableError, match="'ghost'.*kiln.data.no_such_stage_module"):
        build_pipeline(cfg, tmp_path)
    register_stage("hollow", "kiln.data.pipeline:no_such_factory")
    with pytest.raises(StageUnavailableError, match="'hollow'.*no_such_factory"):
        build_pipeline(PrepareConfig(stages=["read", "hollow", "write"]), tmp_path)
    assert not (tmp_path / "documents").exists()


def test_missing_dependency_of_a_stage_module_is_named(tmp_path, registry):
    mod = tmp_path / "kiln_fake_stage_mod.py"
    mod.write_text("import kiln_definitely_missing_dep\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        register_stage("needy", "kiln_fake_stage_mod:needy_stage")
        with pytest.raises(StageUnavailableError, match="kiln_definitely_missing_dep"):
            build_pipeline(PrepareConfig(stages=["read", "needy", "write"]), tmp_path)
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize(("stages", "message"), [
    (["read", "qualty", "write"], "did you mean 'quality'"),
    (["no_spam", "write"], "start with a reader"),
    (["read"], "end with 'write'"),
    (["read", "no_spam", "no_spam", "write"], "more than once"),
    ([], "empty"),
    # a second reader would add documents that skipped the stages before it
    (["read", "no_spam", "arxiv_metadata", "write"],
     "'arxiv_metadata' reads documents of its own and must come first, not after 'no_spam'"),
    (["arxiv_metadata", "latex", "read", "write"], "'read' reads documents .* here 'arxiv_metadata'"),
    (["read", "arxiv_sources", "latex", "write"], r"or after 'arxiv_metadata', whose documents"),
    # read from a folder alone, a paper has no text before `latex`: exact dedup dropped them all
    (["arxiv_sources", "dedup_exact", "latex", "write"],
     r"'dedup_exact' stands between 'arxiv_sources' and 'latex'"),
    (["arxiv_sources", "language", "quality", "latex", "write"],
     r"'language', 'quality' stand between"),
])
def test_bad_stage_lists(tmp_path, registry, stages, message):
    with pytest.raises(ConfigError, match=message):
        build_pipeline(PrepareConfig(stages=stages), tmp_path)



def test_stages_may_judge_the_abstract_before_the_conversion(tmp_path, registry):
    """After `arxiv_metadata` a paper's text before `latex` is its abstract, a real text (a
    language or quality judgement there spares converting the papers it drops): not
    refused."""
    from kiln.data.prepare_checks import _refuse_stages_before_conversion

    _refuse_stages_before_conversion(
        ["arxiv_metadata", "arxiv_sources", "language", "dedup_exact", "latex", "write"])


def test_a_run_prepared_with_a_later_reader_still_loads(tmp_path):
    """An older Kiln prepared (and trained on) `read, ..., arxiv_metadata`: its recorded
    config.toml still loads, so the run's model resumes, evaluates and exports; only making
    data that way again is refused."""
    from dataclasses import replace

    from kiln.config import Config, config_to_toml, recorded_config

    base = Config()
    prepare = replace(base.prepare, stages=["read", "quality", "arxiv_metadata", "write"],
                      arxiv=replace(base.prepare.arxiv, snapshot=str(tmp_path / "meta.jsonl")))
    (tmp_path / "config.toml").write_text(config_to_toml(replace(base, prepare=prepare)))
    old = recorded_config(tmp_path)
    assert old is not None and old.prepare.stages == prepare.stages
    with pytest.raises(ConfigError, match="'arxiv_metadata' reads documents of its own"):
        build_pipeline(old.prepare, tmp_path)

def test_executor_choices(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="slurm_partition"):
        build_pipeline(PrepareConfig(executor="slurm"), tmp_path)
    with pytest.raises(ConfigError, match="prepare.executor"):
        build_pipeline(PrepareConfig(executor="dask"), tmp_path)
    monkeypatch.setattr(prepare_executor.importlib.util, "find_spec", lambda name: None)
    phases, _ = build_pipeline(PrepareConfig(stages=["read", "write"], executor="ray"), tmp_path)
    steps = phases[0].pipeline
    with pytest.raises(RuntimeError, match="ray"):
        make_executor(PrepareConfig(executor="ray"), steps, tmp_path / "logs", False)
    monkeypatch.setattr(prepare_executor.shutil, "which", lambda name: None)
    cfg = PrepareConfig(executor="slurm", slurm_partition="cpu")
    with pytest.raises(RuntimeError, match="sbatch"):
        make_executor(cfg, steps, tmp_path / "logs", False)


def test_every_registered_stage_is_meter_wrapped(tmp_path, registry):
    phases, layout = build_pipeline(_cfg(), tmp_path, [str(tmp_path)])
    assert [r["stage"] for r in layout["steps"]] == [
        "read", "read", "no_spam", "no_spam", "write", "write"]
    assert [r["meter"] for r in layout["steps"]] == [False, True] * 3
    assert len(phases) == 1 and len(phases[0].pipeline) == 6 and layout["readers"] == ["read"]


def test_bare_executor_phases_must_come_as_a_stage_plan(tmp_path, registry):
    class FakeExecutorStage:
        name, pipeline, tasks = "minhash_signature", [], 1

    register_stage("multi", lambda ctx: [FakeExecutorStage()])
    with pytest.raises(NotImplementedError, match="StagePlan"):
        build_pipeline(PrepareConfig(stages=["read", "multi", "write"]), tmp_path)


@pytest.mark.parametrize("workers,console_logs", [(1, False), (2, False), (2, True)])
def test_datatrove_task_logs_stay_in_their_files_unless_asked(tmp_path, workers, console_logs):
    """The local executor's task logs (pipeline, statistics) always reach the task log
    files; on the console only with prepare.console_logs (in a process of its own: worker
    processes write to the stderr they were started with)."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i}.txt").write_text(f"document {i} " + "words and more words. " * 30)
    run = tmp_path / "run"
    sets = [f'run.dir="{run}"', f'data.sources=["{src}"]', 'prepare.stages=["read", "write"]',
            "prepare.tasks=2", f"prepare.workers={workers}",
            f"prepare.console_logs={str(console_logs).lower()}"]
    done = subprocess.run([sys.executable, "-m", "kiln.cli", "prepare",
                           *[x for s in sets for x in ("--set", s)]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    logs = "".join(p.read_text() for p in (run / "logs" / "prepare" / "logs").glob("task_*.log"))
    assert "PIPELINE" in logs and "Stats: Task" in logs
    for shown in ("PIPELINE", "Stats: Task", "Stats: All 2 tasks"):
        assert (shown in done.stderr) == console_logs, shown
    assert ("task logs (pipeline, per-step statistics) go to" in done.stderr) != console_logs


def test_the_default_log_sink_is_back_after_a_quiet_prepare(tmp_path, capfd):
    from loguru import logger

    from kiln.config import load_config
    from kiln.data.pipeline import run_prepare

    (tmp_path / "a.txt").write_text("some words of text. " * 20)
    cfg = load_config(None, [f'run.dir="{tmp_path / "run"}"', 'prepare.stages=["read", "write"]'])
    run_prepare(cfg.prepare, tmp_path / "run", sources=[str(tmp_path / "a.txt")], progress=False)
    assert "PIPELINE" not in capfd.readouterr().err
    logger.info("after prepare")
    assert "after prepare" in capfd.readouterr().err


def test_reading_prepared_documents_keeps_datatrove_info_off_the_console(tmp_path, capfd):
    """`kiln tokenizer` and `kiln tokenize` read the documents with datatrove's reader, which
    logs a line per file at INFO; the console shows Kiln's lines alone, and the default sink
    is back afterwards."""
    from loguru import logger

    from kiln.config import load_config
    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare

    (tmp_path / "a.txt").write_text("some words of text. " * 20)
    cfg = load_config(None, [f'run.dir="{tmp_path / "run"}"', 'prepare.stages=["read", "write"]'])
    run_prepare(cfg.prepare, tmp_path / "run", sources=[str(tmp_path / "a.txt")], progress=False)
    capfd.readouterr()
    texts = [doc.text for doc in read_documents(tmp_path / "run")]
    assert texts == ["some words of text. " * 20]
    assert "Reading input file" not in capfd.readouterr().err
    logger.info("after reading")
    assert "after reading" in capfd.readouterr().err


def test_perplexity_scores_from_before_the_whole_context_window_are_not_resumed():
    """The scorer now scores a model's whole context (one token more than before): a prepare
    with the perplexity stage records so, so one made before re-scores instead of resuming
    with old and new scores under one threshold; runs without the stage keep resuming."""
    from kiln.data.prepare_signature import make_signature

    scored = make_signature(PrepareConfig(stages=["read", "perplexity", "write"]), ["src"], 0)
    assert scored["perplexity_scored_tokens"] == "max_seq_len"
    assert "perplexity_scored_tokens" not in make_signature(_cfg(), ["src"], 0)
