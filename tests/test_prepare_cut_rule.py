"""A prepare records the rule that cut its long texts into parts (kiln.data.long_documents):
one whose texts were cut by an earlier rule (a last part of a few words, which the quality
rules dropped) is made again rather than resumed or kept, so no run mixes the two kinds of
parts. A run that cut no text made the same documents under either rule: it keeps them, and
their fingerprint (its shards stay current)."""

from __future__ import annotations

import json

import pytest

from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.prepare_signature import make_signature
from kiln.data.provenance import documents_fingerprint
from kiln.data.yield_report import LAYOUT_FILE


def _prepare(run, src) -> None:
    run_prepare(PrepareConfig(stages=["read", "write"], tasks=1), run, [str(src)], progress=False)


def _as_recorded_before_the_rule(run) -> None:
    """The layout a Kiln from before the rule was recorded wrote: no `long_text_cut`."""
    path = run / "logs" / "prepare" / LAYOUT_FILE
    layout = json.loads(path.read_text())
    del layout["signature"]["long_text_cut"]
    path.write_text(json.dumps(layout))


@pytest.mark.parametrize("long", [False, True])
def test_a_run_that_cut_texts_by_the_earlier_rule_is_made_again(tmp_path, capfd, long):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a short text of words. " * 20)
    if long:  # over 1,000,000 characters: read as parts
        (src / "book.txt").write_text("Some words in a sentence here.\n\n" * 40_000)
    run = tmp_path / "run"
    _prepare(run, src)
    assert ("long_texts" in json.loads((run / "prepare.json").read_text())) == long
    made = documents_fingerprint(run)
    _as_recorded_before_the_rule(run)
    # parts cut by another rule are other documents: their fingerprint says so
    assert (documents_fingerprint(run) != made) == long
    capfd.readouterr()
    _prepare(run, src)
    kept = "prepare: kept" in capfd.readouterr().err
    assert kept != long  # made again where texts were cut; kept, as finished, where none was
    assert documents_fingerprint(run) == made


def test_the_rule_is_recorded_for_the_read_stage_only():
    assert make_signature(PrepareConfig(stages=["read", "write"]), ["src"], 0)[
        "long_text_cut"] == "halved_end"
    assert "long_text_cut" not in make_signature(
        PrepareConfig(stages=["arxiv", "write"]), ["src"], 0)


def test_a_stats_file_that_cannot_be_read_counts_as_one_that_cut(tmp_path):
    """A resume keeps the finished tasks' documents: where their stats cannot tell whether
    one cut a text, the prepare is made again rather than risk mixing parts."""
    from kiln.data.prepare_signature import cut_texts

    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "00000.json").write_text(json.dumps([{"name": "read", "stats": {"documents": 3}}]))
    assert not cut_texts(tmp_path)
    (stats / "00001.json").write_text(json.dumps([{"name": "r", "stats": {"long_texts_split": 1}}]))
    assert cut_texts(tmp_path)
    (stats / "00001.json").write_text("[{")
    assert cut_texts(tmp_path)


@pytest.mark.parametrize("long", [False, True])
def test_a_trained_run_whose_texts_were_cut_by_the_earlier_rule_keeps_its_data(tmp_path, capsys,
                                                                               long):
    """A run with checkpoints keeps the data they were trained on: a plain `kiln prepare` /
    `kiln run` of one whose texts were cut by the earlier rule made its documents again
    (archived the ones trained on), so the tokens were re-made under the checkpoints and the
    resume was refused. It is refused before any work, with the way on."""
    from conftest import tiny_config

    from kiln.cli import cmd_prepare, main
    from kiln.run_dir import write_run_metadata

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a short text of words. " * 20)
    if long:
        (src / "book.txt").write_text("Some words in a sentence here.\n\n" * 40_000)
    run = tmp_path / "run"
    cfg = tiny_config(run, f'data.sources=["{src}"]', 'prepare.stages=["read", "write"]')
    cmd_prepare(cfg)
    write_run_metadata(cfg)
    _as_recorded_before_the_rule(run)
    ckpt = run / "checkpoints" / "step_00000002"  # trained: a complete checkpoint
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.pt").write_bytes(b"")
    made = documents_fingerprint(run)
    docs = {p.name: p.read_bytes() for p in (run / "documents").iterdir()}
    capsys.readouterr()
    for verb in ("prepare", "run") if long else ("prepare",):  # (run: it would train)
        assert main([verb, str(run)]) == (2 if long else 0)
        err = capsys.readouterr().err
        assert ("long texts were cut into parts by an earlier rule" in err) == long, err
        assert documents_fingerprint(run) == made
        assert {p.name: p.read_bytes() for p in (run / "documents").iterdir()} == docs
        assert not (run / "archive").exists()
    if long:
        assert f"`kiln train {run}` and the later verbs go on with the data already made" in err
