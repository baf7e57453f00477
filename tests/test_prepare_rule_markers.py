"""A prepare records the rules of how this Kiln makes documents (RULE_MARKERS: no user
setting). One made under another rule, or by a Kiln from before the rule was recorded, is
made again rather than resumed; a trained run's (checkpoints) keeps the data its checkpoints
were trained on: `kiln prepare` / `kiln run` refuse it before any work, and `kiln train`
goes on with it. (The long-text cut rule: tests/test_prepare_cut_rule.py; the stages' rules
versions, pii's among them: tests/test_stage_rules.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import tiny_config
from test_decontam import bench  # noqa: F401 (a fixture)
from test_prepare_recipes import fake_scorer, text_corpus  # noqa: F401 (a fixture)

from kiln.cli import cmd_prepare, main
from kiln.data.pipeline import PrepareConfig
from kiln.data.provenance import documents_fingerprint
from kiln.data.yield_report import LAYOUT_FILE
from kiln.run_dir import write_run_metadata

STAGES = {"decontaminate_normalisation": ["read", "decontaminate", "write"],
          "decontaminate_pii_forms": ["read", "pii", "decontaminate", "write"],
          "perplexity_scored_tokens": ["read", "perplexity", "write"]}
NAMED = {"decontaminate_normalisation": "matched under an earlier text normalisation",
         "decontaminate_pii_forms": "built by an earlier rule for the items' redacted forms",
         "perplexity_scored_tokens": "perplexity scores were taken by an earlier rule"}


def _prepared(tmp_path, request, key: str):
    """A run prepared with the stage whose rule `key` records, its config recorded; the
    config."""
    stages = STAGES[key]
    extra = [f"prepare.stages={json.dumps(stages)}",
             f'data.sources=["{text_corpus(tmp_path)}"]']
    if "decontaminate" in stages:
        extra.append(f'prepare.decontaminate.benchmarks=["{request.getfixturevalue("bench")[0]}"]')
    if "perplexity" in stages:
        request.getfixturevalue("fake_scorer")  # the real scorer needs a trained run
        extra.append('prepare.perplexity.run_dir="unused"')
    cfg = tiny_config(tmp_path / "run", *extra)
    cmd_prepare(cfg)
    write_run_metadata(cfg)
    return cfg


def _as_recorded_by_an_earlier_kiln(run, key: str, recorded: str) -> None:
    """The layout an earlier Kiln wrote: without the marker, or with another value of it."""
    path = run / "logs" / "prepare" / LAYOUT_FILE
    layout = json.loads(path.read_text())
    assert key in layout["signature"]
    if recorded == "none":
        del layout["signature"][key]
    else:
        layout["signature"][key] = "an-earlier-rule"
    path.write_text(json.dumps(layout))


def _documents(run) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run / "documents").iterdir()}


@pytest.mark.parametrize("recorded", ["none", "another"])
@pytest.mark.parametrize("key", sorted(STAGES))
def test_a_trained_run_made_under_an_earlier_rule_keeps_its_data(tmp_path, capsys, request,
                                                                 key, recorded):
    """A plain `kiln prepare` / `kiln run` of a trained run whose prepare recorded no marker
    (or another one) archived the documents trained on and made them again, so the tokens were
    re-made under the checkpoints and the resume refused. It is refused before any work, naming
    the rule, with the way on."""
    run = _prepared(tmp_path, request, key).run_dir
    _as_recorded_by_an_earlier_kiln(run, key, recorded)
    ckpt = run / "checkpoints" / "step_00000002"  # trained: a complete checkpoint
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.pt").write_bytes(b"")
    made, docs = documents_fingerprint(run), _documents(run)
    capsys.readouterr()
    for verb in ("prepare", "run"):
        assert main([verb, str(run)]) == 2
        err = capsys.readouterr().err
        assert NAMED[key] in err, err
        assert f"`kiln train {run}` and the later verbs go on with the data already made" in err
        assert "--fresh" in err
        assert documents_fingerprint(run) == made and _documents(run) == docs
        assert not (run / "archive").exists()
        assert (ckpt / "trainer.pt").is_file()


@pytest.mark.parametrize("key", sorted(STAGES))
def test_an_untrained_run_made_under_an_earlier_rule_is_made_again(tmp_path, capsys, request,
                                                                   key):
    """Without checkpoints nothing was trained on the documents: they are made again under
    this Kiln's rule, as before, not refused."""
    run = _prepared(tmp_path, request, key).run_dir
    _as_recorded_by_an_earlier_kiln(run, key, "none")
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    err = capsys.readouterr().err
    # the rule is named: the user changed no setting and no source
    assert "earlier documents (documents whose " in err and NAMED[key] in err, err
    assert "this Kiln makes them otherwise) moved to" in err and "settings" not in err, err
    assert key in json.loads((run / "logs" / "prepare" / LAYOUT_FILE).read_text())["signature"]


def test_every_rule_a_signature_records_is_a_marker():
    """A signature entry that is no setting is one of RULE_MARKERS (or the stages' rules
    versions), so a new rule is not left to re-make a trained run's data unrefused."""
    from kiln.data.prepare_signature import RULE_MARKERS, make_signature
    from kiln.data.stage_rules import STAGE_RULES_KEY

    cfg = PrepareConfig(stages=["read", "pii", "decontaminate", "perplexity", "write"])
    settings = {f.name for f in dataclasses.fields(PrepareConfig)}
    recorded = set(make_signature(cfg, ["src"], 0)) - settings - {"sources", "max_bytes"}
    assert recorded == set(RULE_MARKERS) | {STAGE_RULES_KEY}
