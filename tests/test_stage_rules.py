"""Each stage that keeps, drops or rewrites documents declares the version of its rules
(`kiln.data.stage_rules`), and a prepare's signature records those of the stages it runs:
documents made under another version of a used stage's rules are made again (untrained run)
or refused by `prepare` / `run` naming the stage (trained run); a stage not run changes
nothing. A record from before (only `pii_rules`) reads as pii's version, and as no version
of the other stages it ran."""

from __future__ import annotations

import json
import os

import pytest
from conftest import tiny_config
from test_prepare_recipes import text_corpus

from kiln.cli import cmd_prepare, cmd_tokenize, cmd_tokenizer, main
from kiln.data import dating, dedup, gutenberg
from kiln.data.pii.rules_version import PII_RULES
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.prepare_config import STAGES
from kiln.data.prepare_signature import make_signature
from kiln.data.provenance import documents_fingerprint, tokens_match_documents
from kiln.data.stage_rules import STAGE_RULES_KEY, rules_version
from kiln.data.yield_report import LAYOUT_FILE
from kiln.run_dir import write_run_metadata

# the stages that declare no version, and why: a new stage must declare one or be named here
UNVERSIONED = {"read": "makes documents from files; its cut of long texts is a RULE_MARKER",
               "write": "writes the documents as they come"}
USED = ["read", "pii", "dedup_exact", "write"]


def test_every_stage_that_changes_documents_declares_a_version():
    """A stage added (or one whose rules change) with no version would leave a resumed
    prepare mixing its documents, and a finished one silently other than this Kiln's."""
    missing = sorted(s for s in STAGES if s not in UNVERSIONED and not rules_version(s))
    assert not missing, f"declare a rules version (StageSpec.rules) for: {missing}"
    for name in UNVERSIONED:
        assert rules_version(name) is None


def test_the_signature_records_the_versions_of_the_stages_run_only(monkeypatch):
    cfg = PrepareConfig(stages=["read", "pii", "dedup_exact", "write"])
    signature = make_signature(cfg, ["src"], 0)
    assert signature[STAGE_RULES_KEY] == {"pii": PII_RULES,
                                          "dedup_exact": dedup.EXACT_RULES_VERSION}
    assert "pii_rules" not in signature  # one mechanism: pii's is one of the stages'
    monkeypatch.setattr(gutenberg, "RULES_VERSION", "2099-01-01")  # a stage not run
    assert make_signature(cfg, ["src"], 0) == signature
    monkeypatch.setattr(dedup, "EXACT_RULES_VERSION", "2099-01-01")
    assert make_signature(cfg, ["src"], 0)[STAGE_RULES_KEY]["dedup_exact"] == "2099-01-01"


def _config(tmp_path, stages: list[str]):
    cfg = tiny_config(tmp_path / "run", f"prepare.stages={json.dumps(stages)}",
                      f'data.sources=["{text_corpus(tmp_path)}"]')
    cmd_prepare(cfg)
    write_run_metadata(cfg)
    return cfg


def _prepared(tmp_path, stages: list[str]):
    return _config(tmp_path, stages).run_dir


def _trained(run) -> None:
    ckpt = run / "checkpoints" / "step_00000002"  # a complete checkpoint
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.pt").write_bytes(b"")


def _as_recorded_before_stage_versions(run) -> None:
    """The layout today's Kiln wrote before stage versions: pii's alone, as `pii_rules`."""
    path = run / "logs" / "prepare" / LAYOUT_FILE
    layout = json.loads(path.read_text())
    versions = layout["signature"].pop(STAGE_RULES_KEY)
    if "pii" in versions:
        layout["signature"]["pii_rules"] = versions["pii"]
    path.write_text(json.dumps(layout))


def _documents(run) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run / "documents").iterdir()}


@pytest.mark.parametrize("stage", ["pii", "dedup_exact"])
def test_an_untrained_run_made_under_other_rules_of_a_used_stage_is_made_again(
        tmp_path, capsys, monkeypatch, stage):
    run = _prepared(tmp_path, USED)
    monkeypatch.setattr(STAGES[stage].rules.replace(":", "."), "2099-01-01")
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    err = capsys.readouterr().err
    assert (f"documents whose {stage} stage ran under earlier rules (" in err
            and "this Kiln's: 2099-01-01" in err), err
    assert "this Kiln makes them otherwise) moved to" in err and "settings" not in err, err
    assert list((run / "archive").iterdir())  # re-made, the earlier ones kept aside
    layout = json.loads((run / "logs" / "prepare" / LAYOUT_FILE).read_text())
    assert layout["signature"][STAGE_RULES_KEY][stage] == "2099-01-01"


@pytest.mark.parametrize("stage", ["pii", "dedup_exact"])
def test_a_trained_run_made_under_other_rules_of_a_used_stage_is_refused(
        tmp_path, capsys, monkeypatch, stage):
    run = _prepared(tmp_path, USED)
    _trained(run)
    monkeypatch.setattr(STAGES[stage].rules.replace(":", "."), "2099-01-01")
    made, docs = documents_fingerprint(run), _documents(run)
    capsys.readouterr()
    for verb in ("prepare", "run"):
        assert main([verb, str(run)]) == 2
        err = capsys.readouterr().err
        assert f"{stage} stage ran under earlier rules" in err, err
        assert f"`kiln train {run}` and the later verbs go on with the data already made" in err
        assert "--fresh" in err
        assert documents_fingerprint(run) == made and _documents(run) == docs
        assert not (run / "archive").exists()


def test_documents_re_made_under_another_version_leave_the_shards_stale(tmp_path, capsys,
                                                                       monkeypatch):
    """The same counts and bytes here, but other documents in general: the shards made from
    the earlier ones are no longer current (the fingerprint hashes the versions)."""
    cfg = _config(tmp_path, USED)
    cmd_tokenizer(cfg)
    cmd_tokenize(cfg)
    assert tokens_match_documents(cfg.run_dir)
    monkeypatch.setattr(dedup, "EXACT_RULES_VERSION", "2099-01-01")
    assert main(["prepare", str(cfg.run_dir)]) == 0
    assert not tokens_match_documents(cfg.run_dir)


def test_another_version_of_a_stage_not_run_keeps_the_data(tmp_path, capsys, monkeypatch):
    run = _prepared(tmp_path, USED)
    _trained(run)
    made = documents_fingerprint(run)
    monkeypatch.setattr(gutenberg, "RULES_VERSION", "2099-01-01")
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    assert "prepare: kept" in capsys.readouterr().err
    assert documents_fingerprint(run) == made and not (run / "archive").exists()


def test_a_record_with_pii_rules_alone_reads_as_pii_version(tmp_path, capsys):
    """Today's format, for a pipeline whose only versioned stage is pii: the same rules,
    so the prepare resumes and its documents' fingerprint stands."""
    run = _prepared(tmp_path, ["read", "pii", "write"])
    _as_recorded_before_stage_versions(run)
    made = documents_fingerprint(run)
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    assert "prepare: kept" in capsys.readouterr().err
    assert not (run / "archive").exists()
    # the resume rewrote the record in the new format; the documents are the same
    assert STAGE_RULES_KEY in json.loads(
        (run / "logs" / "prepare" / LAYOUT_FILE).read_text())["signature"]
    assert made is not None


def test_a_record_from_before_stage_versions_names_the_stages_it_lacks(tmp_path, capsys):
    """Its other stages' rules changed since (unknown to the record): an untrained run is
    made again naming them (not pii, whose version it holds); a trained one is refused with
    the way on."""
    run = _prepared(tmp_path, USED)
    _as_recorded_before_stage_versions(run)
    capsys.readouterr()
    _trained(run)
    assert main(["run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "dedup_exact stage ran under rules from before Kiln recorded their version" in err
    assert "pii stage" not in err, err
    assert f"`kiln train {run}` and the later verbs go on with the data already made" in err
    (run / "checkpoints" / "step_00000002" / "trainer.pt").unlink()
    (run / "checkpoints" / "step_00000002").rmdir()
    assert main(["prepare", str(run)]) == 0
    err = capsys.readouterr().err
    assert "documents whose dedup_exact stage ran under rules from before" in err, err
    assert "pii stage" not in err, err


def test_a_record_from_before_stage_versions_keeps_its_fingerprint(tmp_path):
    """The documents' fingerprint of a record with `pii_rules` is the one the Kiln before
    computed (taken with that code on these files): its shards stay current for `kiln train`."""
    (tmp_path / "logs" / "prepare").mkdir(parents=True)
    (tmp_path / "prepare.json").write_text(json.dumps({
        "sources": ["/data/src"], "max_bytes": 0, "documents": 7, "bytes": 700, "tasks": 2,
        "stages": USED, "documents_out": 6, "bytes_out": 600,
        "documents_sha256": {"00000.jsonl.gz": "ab"}}))
    signature = {"stages": USED, "tasks": 2, "pii": {"types": None},
                 "dedup_exact": {"normalize": False}, "sources": ["/data/src"],
                 "max_bytes": 0, "pii_rules": "2026-12-07.2", "long_text_cut": "halved_end",
                 "input_files": {"src/a.txt": {"size": 3, "sha256": "cd"}}}
    layout = tmp_path / "logs" / "prepare" / LAYOUT_FILE
    layout.write_text(json.dumps({"signature": signature, "phases": []}))
    assert documents_fingerprint(tmp_path) == PINNED_BEFORE
    layout.write_text(json.dumps({"signature": {**signature, "pii_rules": "other"},
                                  "phases": []}))
    assert documents_fingerprint(tmp_path) != PINNED_BEFORE


PINNED_BEFORE = "db0f40444b92393c"  # the fingerprint the code before stage versions gave


def test_an_unfinished_prepare_is_not_resumed_under_another_version(tmp_path, monkeypatch):
    """Task 1 killed, then the dating rules changed: resuming would keep task 0's documents,
    dated by the earlier rules, beside task 1's, dated by these. Every task runs again."""
    run = tmp_path / "run"
    cfg = PrepareConfig(stages=["read", "dating", "write"], tasks=2)
    sources = [str(text_corpus(tmp_path))]
    run_prepare(cfg, run, sources, progress=False)
    (run / "logs/prepare/completions/00001").unlink()  # killed before it finished
    (run / "logs/prepare/stats/00001.json").unlink()
    (run / "prepare.json").unlink()
    out0 = run / "documents" / "00000.jsonl.gz"
    os.utime(out0, ns=(out0.stat().st_atime_ns, 10**18))  # a probe of which tasks re-run
    monkeypatch.setattr(dating, "DATING_RULES_VERSION", "2099-01-01")
    run_prepare(cfg, run, sources, progress=False)
    assert out0.stat().st_mtime_ns != 10**18  # task 0 made again, not kept


@pytest.mark.parametrize("rules", ["2026-12-07", "v2", "mypkg.stages", ":RULES"])
def test_register_stage_refuses_a_version_given_in_place_of_where_it_is(rules):
    """`rules` names where the version is ("module:CONSTANT"): a version given there itself
    ("v2") was taken as a module, and the prepare failed later, at its signature, saying to
    install what the stage needs."""
    from kiln.data.stage_registry import register_stage

    saved = dict(STAGES)
    try:
        with pytest.raises(ValueError, match=r"'mine'.*module:CONSTANT"):
            register_stage("mine", "kiln.data.stages:quality_stage", rules=rules)
        assert "mine" not in STAGES
        register_stage("mine", "kiln.data.stages:quality_stage",
                       rules="kiln.data.filters.quality:RULES_VERSION")
        assert rules_version("mine") == rules_version("quality")
        register_stage("mine", "kiln.data.stages:quality_stage")  # no version: none recorded
        assert rules_version("mine") is None
    finally:
        STAGES.clear(), STAGES.update(saved)
