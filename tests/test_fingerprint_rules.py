"""The documents' fingerprint (what token shards and a tokenizer record they were made from)
hashes every rule of this Kiln the documents were made under (RULE_MARKERS): documents
re-made under another rule with the same counts and bytes leave the shards made from the
earlier ones stale. Records of the format before (3, which hashed two of the rules) stand
while the run's documents are unchanged: no shards re-made, no resume refused, for that."""

from __future__ import annotations

import json

import pytest
from test_decontam import bench  # noqa: F401 (a fixture)
from test_prepare_recipes import fake_scorer, text_corpus  # noqa: F401 (a fixture)
from test_prepare_rule_markers import STAGES, _as_recorded_by_an_earlier_kiln, _prepared

from kiln.cli import cmd_tokenize, cmd_tokenizer, main
from kiln.data import provenance
from kiln.data.provenance import (
    TOKENIZER_RECORD,
    check_tokens_current,
    documents_fingerprint,
    tokenizer_is_current,
    tokenizer_path,
    tokens_are_current,
    tokens_match_documents,
)
from kiln.data.yield_report import LAYOUT_FILE
from kiln.errors import RunDataError


def _tokenized(tmp_path, request, key: str, earlier: str | None = None):
    """A run prepared with the stage whose rule `key` records (its layout rewritten as an
    earlier Kiln's, where `earlier`: "none" or "another"), then tokenized; its config."""
    cfg = _prepared(tmp_path, request, key)
    if earlier is not None:
        _as_recorded_by_an_earlier_kiln(cfg.run_dir, key, earlier)
    cmd_tokenizer(cfg)
    cmd_tokenize(cfg)
    return cfg


def _current(cfg) -> bool:
    t = cfg.tokenizer
    return (tokens_are_current(cfg.run_dir, cfg.data.val_fraction, cfg.run.seed)
            and tokens_match_documents(cfg.run_dir)
            and tokenizer_is_current(cfg.run_dir, t.kind, t.vocab_size, t.min_frequency))


def _counts(run) -> dict:
    summary = json.loads((run / "prepare.json").read_text())
    return {k: v for k, v in summary.items() if k not in ("tasks", "documents_sha256")}


@pytest.mark.parametrize("earlier", ["none", "another"])
@pytest.mark.parametrize("key", sorted(STAGES))
def test_documents_re_made_under_another_rule_leave_the_shards_stale(tmp_path, capsys, request,
                                                                    key, earlier):
    """An untrained run whose documents were made under an earlier rule (no marker, or
    another value) is made again by `kiln prepare`: the same counts and bytes here, but
    other documents in general. Its shards, tokenizer and the check before training said the
    old shards were current for the PII-forms and perplexity rules."""
    cfg = _tokenized(tmp_path, request, key, earlier)
    run = cfg.run_dir
    assert _current(cfg)
    counts = _counts(run)
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    err = capsys.readouterr().err  # the rule is named, not settings the user never changed
    assert "earlier documents (documents whose " in err, err
    assert "this Kiln makes them otherwise) moved to" in err and "settings" not in err, err
    assert _counts(run) == counts  # re-made, with the same counts and bytes
    assert not tokens_match_documents(run)
    assert not tokens_are_current(run, cfg.data.val_fraction, cfg.run.seed)
    t = cfg.tokenizer
    assert not tokenizer_is_current(run, t.kind, t.vocab_size, t.min_frequency)
    with pytest.raises(RunDataError, match="made from other documents than the run holds now"):
        check_tokens_current(run)


def _as_recorded_in_format_3(run) -> None:
    """The records a Kiln of fingerprint format 3 wrote: the index's `made_from` and the
    tokenizer's record, with the documents hashed as it hashed them."""
    old = documents_fingerprint(run, 3)
    assert old != documents_fingerprint(run)  # the rules the format left out changed it
    index_path = run / "tokens" / "index.json"
    index = json.loads(index_path.read_text())
    index["made_from"].update(documents=old, format=3)
    index_path.write_text(json.dumps(index))
    record_path = tokenizer_path(run).parent / TOKENIZER_RECORD
    record = json.loads(record_path.read_text())
    record.update(documents=old, format=3)
    record_path.write_text(json.dumps(record))


@pytest.mark.parametrize("key", sorted(STAGES))
def test_shards_recorded_in_format_3_stay_current(tmp_path, capsys, request, key):
    """Shards and a tokenizer an earlier Kiln recorded (format 3) from documents unchanged
    since are current: `kiln run` keeps them, `kiln train` trains on them."""
    cfg = _tokenized(tmp_path, request, key)
    run = cfg.run_dir
    _as_recorded_in_format_3(run)
    assert _current(cfg)
    check_tokens_current(run)
    made = json.loads(tokenizer_path(run).parent.joinpath(TOKENIZER_RECORD).read_text())
    assert not provenance.tokenizer_fits_other_documents(run, provenance.shards_made_from(run)
                                                         | {"tokenizer": made["tokenizer"]})


def test_format_3_hashes_as_the_kiln_that_wrote_it(tmp_path):
    """The format-3 fingerprint of a recorded prepare is the one Kiln computed then (taken
    with the code before format 4 on these very files): a change to it would leave every
    run recorded then with stale shards."""
    (tmp_path / "logs" / "prepare").mkdir(parents=True)
    (tmp_path / "prepare.json").write_text(json.dumps({
        "sources": ["/data/src"], "max_bytes": 0, "documents": 7, "bytes": 700, "tasks": 2,
        "stages": ["read", "pii", "decontaminate", "perplexity", "write"],
        "documents_out": 6, "bytes_out": 600, "documents_sha256": {"00000.jsonl.gz": "ab"}}))
    signature = {
        "stages": ["read", "pii", "decontaminate", "perplexity", "write"], "tasks": 2,
        "pii": {"types": None}, "decontaminate": {"n": 13, "benchmarks": ["b.jsonl"]},
        "perplexity": {"run_dir": "unused", "fraction": 0.5}, "sources": ["/data/src"],
        "max_bytes": 0, "decontaminate_normalisation": "casefold-cf",
        "decontaminate_pii_forms": True, "perplexity_scored_tokens": "max_seq_len",
        "long_text_cut": "halved_end",
        "input_files": {"src/a.txt": {"size": 3, "sha256": "cd"}}}
    (tmp_path / "logs" / "prepare" / LAYOUT_FILE).write_text(json.dumps(
        {"signature": signature, "phases": []}))
    assert documents_fingerprint(tmp_path, 3) == "8d1f2fcf0863ed3a"
    format_4 = documents_fingerprint(tmp_path)
    for key, other in (("decontaminate_pii_forms", False), ("perplexity_scored_tokens", "x")):
        changed = {**signature, key: other}
        (tmp_path / "logs" / "prepare" / LAYOUT_FILE).write_text(json.dumps(
            {"signature": changed, "phases": []}))
        assert documents_fingerprint(tmp_path, 3) == "8d1f2fcf0863ed3a"  # the gap format 4 closes
        assert documents_fingerprint(tmp_path) != format_4
