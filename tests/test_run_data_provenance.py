"""Token shards remember the documents and tokenizer they were made from: re-running
`kiln prepare` or `kiln tokenizer` after `kiln tokenize` cannot leave them silently
describing other data."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import tiny_config

from kiln.cli import cmd_prepare, cmd_tokenize, cmd_tokenizer
from kiln.errors import ConfigError, RunDataError
from kiln.train.trainer import Trainer


@pytest.fixture
def made(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i}.txt").write_text(f"document {i}: " + "some words of text here. " * (5 + i))
    run = tmp_path / "run"
    cfg = tiny_config(run, f'data.sources=["{src}"]', "data.val_fraction=0.2",
                      "tokenizer.vocab_size=300", "train.seq_len=16")
    for verb in (cmd_prepare, cmd_tokenizer, cmd_tokenize):
        verb(cfg)
    return cfg, src, run


def _yield(run):
    return json.loads((run / "yield.json").read_text())


def test_re_made_documents_make_the_tokens_stale(made):
    cfg, src, run = made
    tokenized = _yield(run)["tokenize"]["documents"]
    assert tokenized == _yield(run)["documents_out"] > 0
    Trainer(cfg)  # current: accepted
    cmd_prepare(cfg)  # the same sources again: the same documents, the tokens still count
    assert _yield(run)["tokenize"]["documents"] == tokenized
    Trainer(cfg)
    from dataclasses import replace

    other_tasks = replace(cfg, prepare=replace(cfg.prepare, tasks=cfg.prepare.tasks + 1))
    cmd_prepare(other_tasks)  # made again from scratch in more tasks: the same documents
    assert _yield(run)["tokenize"]["documents"] == tokenized
    Trainer(cfg)
    for f in list(src.glob("f1*.txt")):
        f.unlink()
    cmd_prepare(cfg)  # fewer documents
    assert "tokenize" not in _yield(run)  # the old counts describe documents that are gone
    with pytest.raises(RunDataError, match="made from other documents .* re-run `kiln tokenize`"):
        Trainer(cfg)
    cmd_tokenize(cfg)
    assert _yield(run)["tokenize"]["documents"] == _yield(run)["documents_out"] < tokenized
    Trainer(cfg)


def test_tokenize_after_a_new_prepare_notes_the_tokenizer_fits_the_old_documents(made, capsys):
    """`kiln prepare` then `kiln tokenize`, skipping `kiln tokenizer`: the shards are made
    with merges learned on documents the run no longer holds; said, not refused (keeping a
    tokenizer across data is a choice), and not said once the tokenizer is trained again."""
    cfg, src, run = made
    capsys.readouterr()
    cmd_tokenize(cfg)  # nothing changed: no note
    assert "trained on other documents" not in capsys.readouterr().err
    for f in list(src.glob("f1*.txt")):
        f.unlink()
    cmd_prepare(cfg)
    capsys.readouterr()
    cmd_tokenize(cfg)
    assert "the tokenizer was trained on other documents" in capsys.readouterr().err
    cmd_tokenizer(cfg)
    capsys.readouterr()
    cmd_tokenize(cfg)
    assert "trained on other documents" not in capsys.readouterr().err
    (run / "tokenizer" / "made_from.json").unlink()  # a tokenizer put in by hand
    for f in list(src.glob("f2*.txt")):
        f.unlink()
    cmd_prepare(cfg)
    capsys.readouterr()
    cmd_tokenize(cfg)
    assert "trained on other documents" not in capsys.readouterr().err


def test_a_re_trained_tokenizer_makes_the_tokens_stale(made):
    cfg, _, run = made
    from dataclasses import replace

    smaller = replace(cfg, tokenizer=replace(cfg.tokenizer, vocab_size=280))
    cmd_tokenizer(smaller)
    with pytest.raises(RunDataError, match="is not the tokenizer the run's token shards were made"):
        Trainer(cfg)
    cmd_tokenize(cfg)
    Trainer(smaller)  # current again: a model with the tokenizer's settings trains
    # one whose config names the old vocab_size would record settings its data was not made with
    with pytest.raises(ConfigError, match=r"tokenizer.vocab_size: made with 280, set to 300"):
        Trainer(cfg)


def test_shards_brought_into_a_run_without_documents_train(made, tmp_path):
    """Shards and tokenizer copied into a new run dir (no prepare there): nothing to compare
    the documents with, so training goes on."""
    import shutil

    cfg, _, run = made
    other = tmp_path / "other"
    other.mkdir()
    for part in ("tokens", "tokenizer"):
        shutil.copytree(run / part, other / part)
    Trainer(tiny_config(other, "data.val_fraction=0.2", "tokenizer.vocab_size=300",
                        "train.seq_len=16"))


def test_same_counts_other_text_is_stale_and_another_spelling_is_not(made, monkeypatch):
    """An edited source with the same byte count re-makes other documents with the same
    counts: still stale. The same folder named as `src/` or relative is the same input."""
    from dataclasses import replace

    cfg, src, run = made
    monkeypatch.chdir(src.parent)
    for spelling in (f"{src}/", "src"):
        cmd_prepare(replace(cfg, data=replace(cfg.data, sources=[spelling])))
        Trainer(cfg)
    target = src / "f3.txt"
    target.write_text(target.read_text().replace("words", "wordz"))  # same bytes
    cmd_prepare(cfg)
    with pytest.raises(RunDataError, match="made from other documents"):
        Trainer(cfg)


def test_data_verbs_refuse_to_remake_a_trained_runs_data_from_changed_sources(made, capsys):
    """A trained run's checkpoints stay usable: `kiln run` / `kiln prepare` with the same
    settings after a file was added to (or edited in) a source are refused before anything
    is replaced; the unchanged sources re-make the same data as before."""
    import os

    from kiln.cli import main
    from kiln.run_dir import write_run_metadata

    cfg, src, run = made
    write_run_metadata(cfg)
    assert main(["train", str(run), "--set", "train.steps=2", "--set", "train.checkpoint_every=2"]) == 0
    before = {p: p.read_bytes() for p in (run / "tokenizer/tokenizer.json", run / "tokens/index.json",
                                          run / "prepare.json")}
    assert main(["prepare", str(run)]) == 0  # the same files: allowed, the same data
    capsys.readouterr()
    (src / "new.txt").write_text("a new document about music. " * 20)
    for verb in ("prepare", "run"):
        assert main([verb, str(run)]) == 2
        err = capsys.readouterr().err
        assert "checkpoints trained on the sources as they were; they changed since" in err
        assert "read: 40 files" in err and "-> 41 files" in err
        assert "`kiln run --fresh`" in err  # the way to start over that loses nothing
    (src / "new.txt").unlink()
    edited = src / "f3.txt"
    stat = edited.stat()
    edited.write_text(edited.read_text().replace("some", "more"))  # same size, new text
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert main(["prepare", str(run)]) == 2
    err = capsys.readouterr().err
    assert "a file edited or renamed)" in err and "touched" not in err and "go on" not in err
    assert {p: p.read_bytes() for p in before} == before  # nothing was replaced
    edited.write_text(edited.read_text().replace("more", "some"))  # the text trained on
    for file in src.iterdir():  # a fresh checkout: every time new, every byte the same
        os.utime(file, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns + 5 * 10**9))
    assert main(["prepare", str(run)]) == 0
    assert {p: p.read_bytes() for p in before} == before
    assert main(["eval", str(run), "--set", "eval.max_batches=1"]) == 0  # the model still works


def test_a_run_that_recorded_file_times_is_compared_by_times(made, capsys):
    """Runs prepared before contents were hashed recorded (name, size, time): their sources
    are compared the way they were recorded, so an untouched source is still the same input
    and a touched one is named as possibly touched, with the way on."""
    import json
    import os

    from kiln.cli import main
    from kiln.data.sources import fingerprint_files
    from kiln.run_dir import write_run_metadata

    cfg, src, run = made
    write_run_metadata(cfg)
    assert main(["train", str(run), "--set", "train.steps=2", "--set", "train.checkpoint_every=2"]) == 0
    layout_path = run / "logs" / "prepare" / "kiln_pipeline.json"
    layout = json.loads(layout_path.read_text())
    assert layout["signature"]["input_files"]["read"]["by"] == "content"
    layout["signature"]["input_files"]["read"] = fingerprint_files([str(src)], by="mtime")
    layout_path.write_text(json.dumps(layout))
    capsys.readouterr()
    docs = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    assert main(["prepare", str(run)]) == 0  # the same times: the same input, resumed
    assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs
    assert "by" not in json.loads(layout_path.read_text())["signature"]["input_files"]["read"]
    assert main(["run", str(run), "--set", "train.steps=3"]) == 0  # tokens stay current
    assert main(["train", str(run), "--set", "train.steps=4"]) == 0
    capsys.readouterr()
    layout_path.write_text(json.dumps(layout))  # as the earlier Kiln left it
    touched = src / "f3.txt"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    assert main(["prepare", str(run)]) == 2
    err = capsys.readouterr().err
    assert "touched: this run recorded times" in err and f"`kiln train {run}` and the later verbs go on" in err


def test_a_source_spelled_another_way_resumes_and_another_folder_is_refused(made, tmp_path,
                                                                              monkeypatch, capsys):
    """`src`, `src/` and the absolute path name one folder: a trained run resumes and
    re-prepares under any of them; a copy of the folder elsewhere is another setting."""
    import shutil

    from kiln.cli import main
    from kiln.run_dir import write_run_metadata

    cfg, src, run = made
    write_run_metadata(cfg)
    assert main(["train", str(run), "--set", "train.steps=2", "--set", "train.checkpoint_every=2"]) == 0
    monkeypatch.chdir(src.parent)
    docs = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    for spelling in (f"{src}/", "src", "./src/"):
        setting = f'data.sources=["{spelling}"]'
        assert main(["prepare", str(run), "--set", setting]) == 0
        assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs
        assert main(["train", str(run), "--set", setting, "--set", "train.steps=3"]) == 0
    capsys.readouterr()
    shutil.copytree(src, tmp_path / "copy")
    assert main(["train", str(run), "--set", 'data.sources=["copy"]', "--set", "train.steps=4"]) == 2
    assert "data.sources: [" in capsys.readouterr().err


def test_a_relative_source_is_recorded_where_it_was_found(made, tmp_path, monkeypatch):
    """A run started with `data.sources = ["src"]` records the folder that name meant then:
    `kiln prepare RUN` from another directory re-reads (and resumes on) the same files
    instead of looking for ./src where it now stands."""
    from dataclasses import replace

    from kiln.cli import main
    from kiln.config import recorded_config
    from kiln.run_dir import write_run_metadata

    cfg, src, run = made
    monkeypatch.chdir(src.parent)
    write_run_metadata(replace(cfg, data=replace(cfg.data, sources=["src"])))
    assert recorded_config(run).data.sources == [str(src)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    docs = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    assert main(["prepare", str(run)]) == 0
    assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs
    assert main(["train", str(run), "--set", "train.steps=2"]) == 0


# -- what `kiln run` keeps -------------------------------------------------------------------

def _current(cfg):
    from kiln.data.provenance import tokenizer_is_current, tokens_are_current

    t = cfg.tokenizer
    return (tokenizer_is_current(cfg.run_dir, t.kind, t.vocab_size, t.min_frequency),
            tokens_are_current(cfg.run_dir, cfg.data.val_fraction, cfg.run.seed))


def test_the_tokenizer_and_shards_are_current_until_an_input_changes(made):
    """`kiln run` keeps the tokenizer and shards only while re-making them would give the
    same: each input (documents, tokenizer settings and file, split, a whole shard) counts."""
    import dataclasses

    cfg, src, run = made
    assert _current(cfg) == (True, True)
    for key, value in [("vocab_size", 301), ("min_frequency", 3), ("kind", "math")]:
        other = dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, **{key: value}))
        assert _current(other) == (False, True), key  # the shards follow the tokenizer file
    assert _current(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_fraction=0.3))) \
        == (True, False)
    assert _current(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=1))) \
        == (True, False)
    shard = run / "tokens" / "train_00000.bin"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-2])  # a shard cut short
    assert _current(cfg) == (True, False)
    tokens = np.frombuffer(whole, dtype=np.uint16).copy()
    i = int(np.flatnonzero(tokens[:-1] != tokens[1:])[0])
    tokens[[i, i + 1]] = tokens[[i + 1, i]]
    shard.write_bytes(tokens.tobytes())  # edited in place: the same size, other tokens
    assert _current(cfg) == (True, False)
    shard.write_bytes(whole)
    assert _current(cfg) == (True, True)  # put back: hashed again, and the same
    tokenizer = run / "tokenizer" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text() + " ")  # another file in its place
    assert _current(cfg) == (False, False)
    cmd_tokenizer(cfg)
    cmd_tokenize(cfg)
    assert _current(cfg) == (True, True)
    (src / "f0.txt").write_text("an edited document, other words than before. " * 9)
    cmd_prepare(cfg)
    assert _current(cfg) == (False, False)


def test_a_changed_stage_option_changes_the_documents_fingerprint(tmp_path):
    """Another injection seed places the replicas elsewhere with the same counts: shards
    made before it describe other documents."""
    from dataclasses import replace

    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import InjectOptions
    from kiln.data.provenance import documents_fingerprint

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"d{i}.txt").write_text(f"web document number {i} " * 5)
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "what is six and seven", "solution": "thirteen"}) + "\n")
    cfg = PrepareConfig(stages=["read", "inject_replicas", "write"], tasks=1,
                        inject_replicas=InjectOptions(benchmark=str(bench), k=3, seed=0))
    run = tmp_path / "run"

    def fingerprint(c: PrepareConfig) -> str | None:
        run_prepare(c, run, [str(src)], progress=False)
        return documents_fingerprint(run)

    seed0 = fingerprint(cfg)
    seed1 = fingerprint(replace(cfg, inject_replicas=replace(cfg.inject_replicas, seed=1)))
    assert seed0 != seed1
    assert fingerprint(cfg) == seed0


def test_a_trained_run_re_made_with_another_vocabulary_trains_the_tokenizers(made, capsys):
    """The trainer recorded the resolved model.vocab_size in config.toml: after the
    checkpoints were moved aside as the data verbs advise and the data re-made with another
    tokenizer.vocab_size, `kiln train RUN` refused a larger tokenizer ('model.vocab_size
    (270) is smaller than the tokenizer's'), though no one had set it, and padded a smaller one."""
    from safetensors import safe_open

    from kiln.cli import main
    from kiln.run_dir import write_run_metadata

    cfg, _, run = made
    write_run_metadata(cfg)  # as `kiln run` records it
    short = ["--set", "train.steps=2", "--set", "train.checkpoint_every=2"]
    for n, vocab in enumerate((270, 300, 260)):  # the corpus holds 285 tokens' worth: 300 -> 285
        if n:  # as the data verbs advise for a trained run
            aside = run.parent / f"aside-{n}"
            aside.mkdir()
            for name in ("checkpoints", "metrics.jsonl"):
                (run / name).rename(aside / name)
        assert main(["tokenizer", str(run), "--set", f"tokenizer.vocab_size={vocab}"]) == 0
        assert main(["tokenize", str(run)]) == 0
        capsys.readouterr()
        assert main(["train", str(run), *short]) == 0, capsys.readouterr().err
        made_vocab = json.loads((run / "tokens/index.json").read_text())["vocab_size"]
        with safe_open(run / "checkpoints/step_00000002/model.safetensors", "pt") as f:
            assert f.get_slice("embed.weight").get_shape()[0] == made_vocab == min(vocab, 285)


# -- the documents files themselves ----------------------------------------------------------

def _edit_a_word(path):
    """One word changed for another of its length: the same documents and bytes."""
    import gzip

    text = gzip.decompress(path.read_bytes()).decode()
    assert "words" in text
    path.write_bytes(gzip.compress(text.replace("words", "wordz", 1).encode()))


def test_a_word_edited_in_the_documents_after_prepare_is_not_kept_by_kiln_run(made, capsys):
    """The documents' fingerprint is of what prepare read and reported; a word edited in
    RUN/documents since has the same counts, so `kiln run` kept the tokenizer and shards of
    the old text. Now prepare records each file's sha256: `kiln run` re-makes them, and the
    re-make refuses the edited file by name (prepare.json, yield.json and the report would
    describe other text; edited documents go in as data.sources)."""
    from kiln.commands.run import _tokenize_unless_current, _tokenizer_unless_current

    cfg, src, run = made
    shards = (run / "tokens" / "index.json").read_bytes()
    _edit_a_word(run / "documents" / "00000.jsonl.gz")
    cmd_prepare(cfg)  # `kiln run`'s first stage: a resume, which leaves the documents be
    assert _current(cfg) == (False, False)
    for stage in (_tokenizer_unless_current, _tokenize_unless_current):
        with pytest.raises(RunDataError, match=r"00000\.jsonl\.gz is not the file `kiln prepare` "
                                               r"wrote .* edited since `kiln prepare`.*resume=false"):
            stage(cfg)
    assert (run / "tokens" / "index.json").read_bytes() == shards  # nothing made of it
    cmd_prepare(replace(cfg, prepare=replace(cfg.prepare, resume=False)))  # made again
    assert _current(cfg) == (True, True)  # the same documents as the shards' once more


def test_document_hashes_are_taken_again_only_when_a_files_stat_changed(made, monkeypatch):
    """Checking the documents costs a stat per file; a copy of the run is hashed once."""
    import shutil

    import kiln.data.shard_hashes as sh

    cfg, _, run = made
    hashed = []
    real = sh.file_sha256
    monkeypatch.setattr(sh, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    assert _current(cfg) == (True, True)
    assert hashed == []
    copy = run.parent / "copy"
    shutil.copytree(run, copy)
    moved = replace(cfg, run=replace(cfg.run, dir=copy))
    assert _current(moved) == (True, True)
    n_files = len(list((copy / "documents").glob("*.jsonl.gz")))
    assert sorted(hashed) == sorted([p.name for p in (copy / "documents").glob("*.jsonl.gz")]
                                    + [p.name for p in (copy / "tokens").glob("*.bin")])
    hashed.clear()
    assert _current(moved) == (True, True) and hashed == []
    assert n_files >= 1


def test_a_prepare_from_before_document_hashes_keeps_its_data_and_records_them(made, capsys):
    """An older run's prepare.json has no hashes: its tokenizer and shards stay current (no
    forced re-tokenize); `kiln run`'s prepare (a resume) hashes the files as they are, says
    so, and from then on an edit is told."""
    cfg, _, run = made
    summary = json.loads((run / "prepare.json").read_text())
    summary.pop("documents_sha256")
    (run / "prepare.json").write_text(json.dumps(summary))
    (run / ".documents-checked.json").unlink()
    assert _current(cfg) == (True, True)
    capsys.readouterr()
    cmd_prepare(cfg)
    assert "hashed now, as they are" in capsys.readouterr().err
    assert "documents_sha256" in json.loads((run / "prepare.json").read_text())
    assert _current(cfg) == (True, True)
    _edit_a_word(run / "documents" / "00000.jsonl.gz")
    assert _current(cfg) == (False, False)


def test_a_renamed_documents_file_is_other_documents(made):
    """Same counts, another name: the documents come in another order (and files prepare did
    not write are read): not the data the shards were made of."""
    from kiln.data.prepared import read_documents

    cfg, _, run = made
    docs = run / "documents"
    last = sorted(docs.glob("*.jsonl.gz"))[-1]
    last.rename(docs / "00099.jsonl.gz")
    assert _current(cfg) == (False, False)
    with pytest.raises(RunDataError, match=r"other files than `kiln prepare` wrote .*\+00099"):
        list(read_documents(run))
