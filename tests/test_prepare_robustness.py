"""Prepare on bad input: one bad JSONL line, a corpus that yields nothing, a source that grows."""

import json

import pytest

from kiln.config import ConfigError
from kiln.data.documents import SourceReader, read_documents
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.errors import NoDocumentsError

READ_WRITE = PrepareConfig(stages=["read", "write"])


def _read(sources):
    reader = SourceReader([str(s) for s in sources], progress=False)
    return list(reader.run()), dict(reader.counts)


def test_lone_surrogate_skips_only_its_line(tmp_path):
    lines = [json.dumps({"text": f"good {i}"}) for i in range(52)]
    lines[1] = '{"text": "bad \\ud800 surrogate"}'  # valid JSON, not encodable as UTF-8
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    docs, counts = _read([tmp_path / "s.jsonl"])
    assert len(docs) == 51 and docs[1].id == "s.jsonl:3" and docs[-1].text == "good 51"
    assert counts["skipped/invalid_unicode"] == 1 and "skipped/unreadable" not in counts
    summary = run_prepare(READ_WRITE, tmp_path / "run", [str(tmp_path / "s.jsonl")],
                          progress=False)
    assert summary["documents"] == 51 and summary["skipped"] == {"invalid_unicode": 1}


def test_deeply_nested_json_line_skips_only_its_line(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "d.jsonl").write_text(f'{{"text": "a"}}\n{deep}\n{{"text": "b"}}\n')
    docs, counts = _read([tmp_path / "d.jsonl"])
    assert [d.text for d in docs] == ["a", "b"] and counts["skipped/bad_json"] == 1


@pytest.mark.parametrize("content", [b"caf\xe9 latin-1\n", b""])
def test_prepare_of_a_corpus_with_no_documents_fails_with_skip_counts(tmp_path, content):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_bytes(content)
    reason = "non_utf8" if content else "empty"
    with pytest.raises(NoDocumentsError, match=rf"data.sources: prepare read no documents.*{reason}=3"):
        run_prepare(READ_WRITE, tmp_path / "run", [str(src)], progress=False)
    with pytest.raises(FileNotFoundError, match="wrote no documents"):
        list(read_documents(tmp_path / "run"))


def test_prepare_that_drops_every_document_fails_naming_the_stage(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("same text")
    (src / "b.txt").write_text("same text")
    cfg = PrepareConfig(stages=["read", "dedup_exact", "write"], tasks=1)
    summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    assert summary["documents_out"] == 1  # one survives: no error
    (src / "b.txt").unlink()
    (src / "a.txt").write_text("")
    with pytest.raises(NoDocumentsError, match="empty=1"):
        run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)


def _texts(run):
    return sorted(d.text for d in read_documents(run))


def test_rerun_after_adding_a_file_prepares_from_scratch(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha")
    run = tmp_path / "run"
    cfg = PrepareConfig(stages=["read", "write"], tasks=2)
    first = run_prepare(cfg, run, [str(src)], progress=False)
    assert first["documents"] == 1
    # unchanged inputs: a completed run resumes, every task skipped, same outputs
    docs_mtime = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    assert run_prepare(cfg, run, [str(src)], progress=False) == first
    assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs_mtime
    # a new file in the folder: from scratch, both documents
    (src / "b.txt").write_text("beta")
    second = run_prepare(cfg, run, [str(src)], progress=False)
    assert second["documents"] == 2 and _texts(run) == ["alpha", "beta"]
    # an edited file (size and mtime change): from scratch too
    (src / "a.txt").write_text("alpha, edited")
    assert run_prepare(cfg, run, [str(src)], progress=False)["bytes"] == len("alpha, editedbeta")
    assert _texts(run) == ["alpha, edited", "beta"]
    # a removed file
    (src / "b.txt").unlink()
    assert run_prepare(cfg, run, [str(src)], progress=False)["documents"] == 1


def test_run_dir_inside_the_source_folder_still_resumes(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    run = tmp_path / "runs" / "r"
    cfg = PrepareConfig(stages=["read", "write"], tasks=1)
    first = run_prepare(cfg, run, [str(tmp_path)], progress=False)
    stats = run / "logs/prepare/stats/00000.json"
    before = stats.read_bytes()
    assert run_prepare(cfg, run, [str(tmp_path)], progress=False) == first
    assert stats.read_bytes() == before  # skipped, not re-run


def test_byte_order_mark_and_upper_case_suffix(tmp_path):
    bom = "\ufeff".encode()
    (tmp_path / "a.txt").write_bytes(bom + b"plain text")
    (tmp_path / "B.JSONL").write_bytes(bom + b'{"text": "first"}\n{"text": "second"}\n')
    docs, counts = _read([tmp_path / "a.txt", tmp_path / "B.JSONL"])
    assert sorted(d.text for d in docs) == ["first", "plain text", "second"]
    assert not any(k.startswith("skipped/") for k in counts)


def test_a_non_utf8_file_name_is_read_under_an_escaped_id(tmp_path):
    """A Latin-1 file name (bytes that are not UTF-8) used to crash the JSON writer."""
    import os

    folder = tmp_path / "names"
    folder.mkdir()
    (folder / "good.txt").write_text("good text")
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "w") as f:
        f.write("latin-1 named file")
    summary = run_prepare(READ_WRITE, tmp_path / "run", [str(folder)], progress=False)
    assert summary["documents"] == 2 and summary["skipped"] == {}
    ids = sorted(d.id for d in read_documents(tmp_path / "run"))
    assert ids == ["names/caf\\xe9.txt", "names/good.txt"]


def test_a_huge_json_number_skips_its_line_not_the_rest_of_the_file(tmp_path):
    lines = [json.dumps({"text": f"record {i}"}) for i in range(10)]
    lines[2] = '{"text": "x", "answer": ' + "9" * 5000 + "}"  # over Python's int-digit limit
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    docs, counts = _read([tmp_path / "m.jsonl"])
    assert len(docs) == 9 and counts["skipped/bad_json"] == 1
    assert "skipped/unreadable" not in counts


def test_every_file_left_out_is_counted(tmp_path):
    """Hidden files, pipes and empty jsonl / parquet are counted; folder links are followed
    once (a loop is not); .ndjson is JSON Lines; a .json of records is records, other JSON is
    text; UTF-16 text with its byte-order mark is read."""
    import gzip
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    (elsewhere / "linked.txt").write_text("reached through a folder link")
    (data / "link").symlink_to(elsewhere, target_is_directory=True)
    (data / "loop").symlink_to(data, target_is_directory=True)
    (data / ".hidden.txt").write_text("a hidden note")
    os.mkfifo(data / "pipe.txt")
    (data / "blank.jsonl").write_text("\n\n")
    (data / "zero.parquet").write_bytes(b"")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), data / "none.parquet")
    pq.write_table(pa.table({"text": pa.array([b"bytes column"], pa.binary())}), data / "b.parquet")
    (data / "d.ndjson").write_text('{"text": "nd one"}\n{"text": "nd two"}\n')
    (data / "records.json").write_text('[{"text": "rec one"}, {"text": "rec two"}]')
    (data / "package.json").write_text('{"name": "x", "version": "1.0"}')
    (data / "notepad.txt").write_bytes("utf-16 text".encode("utf-16"))
    (data / "z.txt.gz").write_bytes(gzip.compress(b"gzipped text"))
    docs, counts = _read([data])
    assert sorted(d.text for d in docs) == sorted([
        "reached through a folder link", "bytes column", "nd one", "nd two", "rec one",
        "rec two", '{"name": "x", "version": "1.0"}', "utf-16 text", "gzipped text"])
    skipped = {k: v for k, v in counts.items() if k.startswith("skipped/")}
    assert skipped == {"skipped/hidden": 1, "skipped/not_regular": 1, "skipped/empty": 3}


def test_a_truncated_jsonl_gz_keeps_what_came_before_and_says_so(tmp_path):
    import gzip

    blob = gzip.compress("".join(json.dumps({"text": f"r{i}"}) + "\n"
                                 for i in range(2000)).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    docs, counts = _read([tmp_path / "cut.jsonl.gz"])
    assert 0 < len(docs) < 2000 and [d.text for d in docs] == [f"r{i}" for i in range(len(docs))]
    assert counts["skipped/unreadable_rest_of_file"] == 1 and "skipped/unreadable" not in counts


def test_a_damaged_gz_is_counted_not_fatal(tmp_path):
    """A .txt.gz or .jsonl.gz with bytes flipped mid-stream raises zlib.error (not an
    OSError); it is one unreadable file, and the records of the .jsonl.gz before it stay."""
    import gzip
    import random

    text = "".join(json.dumps({"text": f"r{i} " + "w" * random.Random(i).randrange(50)}) + "\n"
                   for i in range(3000)).encode()
    blob = bytearray(gzip.compress(text))
    middle = len(blob) // 2
    blob[middle:middle + 60] = bytes(60)
    for name in ("bad.txt.gz", "bad.jsonl.gz"):
        (tmp_path / name).write_bytes(bytes(blob))
    (tmp_path / "good.txt").write_text("fine")
    docs, counts = _read([tmp_path])
    assert counts["skipped/unreadable"] == 1  # the .txt.gz
    assert counts["skipped/unreadable_rest_of_file"] == 1  # the .jsonl.gz, its start kept
    assert 1 < len(docs) < 3001 and "fine" in {d.text for d in docs}


@pytest.mark.parametrize("name", ["plain.jsonl.gz", "plain.jsonl.zst", "plain.jsonl.xz",
                                  "plain.json.bz2"])
def test_a_file_not_compressed_as_its_name_says_is_unreadable_not_cut_off(tmp_path, name):
    """JSON lines saved under a .gz name (a download already decompressed): its first read
    fails. It was counted `unreadable_rest_of_file` at line 1, which says a truncated
    download; it is `unreadable`, as a .txt.gz that is not gzip is."""
    (tmp_path / name).write_text('{"text": "plain JSON lines"}\n')
    (tmp_path / "plain.txt.gz").write_text("plain text\n")
    docs, counts = _read([tmp_path])
    assert docs == []
    assert counts == {"skipped/unreadable": 2}


def test_utf32_is_binary_and_hidden_files_leave_the_input_fingerprint_alone(tmp_path):
    from kiln.data.sources import fingerprint_files

    (tmp_path / "u32.txt").write_bytes("hello utf32 world\n".encode("utf-32"))
    (tmp_path / "ok.txt").write_text("ok")
    docs, counts = _read([tmp_path])
    assert [d.text for d in docs] == ["ok"] and counts["skipped/binary"] == 1
    before = fingerprint_files([str(tmp_path)])
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x01")
    assert fingerprint_files([str(tmp_path)]) == before


def test_written_documents_carry_the_bytes_of_their_final_text(tmp_path):
    """PII redaction edits the text after the reader measured it: metadata.bytes is the
    written text's."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("write to dagny.holm.reyes@posteo.de for the code")
    cfg = PrepareConfig(stages=["read", "pii", "write"], tasks=1)
    run_prepare(cfg, tmp_path / "run", [str(tmp_path / "src")], progress=False)
    (doc,) = read_documents(tmp_path / "run")
    assert "<EMAIL>" in doc.text
    assert doc.metadata["bytes"] == len(doc.text.encode()) < len("write to dagny.holm.reyes@posteo.de")


def test_prepare_json_and_yield_json_count_the_redactions(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("mail dagny.holm@posteo.de or ole.brun@posteo.de")
    (tmp_path / "src" / "b.txt").write_text("server 93.184.216.34 is up, ask ole.brun@posteo.de")
    cfg = PrepareConfig(stages=["read", "pii", "write"], tasks=2)
    summary = run_prepare(cfg, tmp_path / "run", [str(tmp_path / "src")], progress=False)
    assert summary["pii_redactions"] == {"EMAIL": 3, "IP_ADDRESS": 1}
    from_docs = {}
    for doc in read_documents(tmp_path / "run"):
        for kind, n in doc.metadata["pii"].items():
            from_docs[kind] = from_docs.get(kind, 0) + n
    assert {k: n for k, n in from_docs.items() if n} == summary["pii_redactions"]
    rows = json.loads((tmp_path / "run" / "yield.json").read_text())["stages"]
    assert [r.get("redactions") for r in rows if r["stage"] == "pii"] == [summary["pii_redactions"]]


def test_a_users_own_folders_in_run_dir_are_never_replaced(tmp_path):
    """run.dir pointed at a folder of the user's own: prepare would delete its documents/."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("alpha")
    run = tmp_path / "project"
    (run / "documents").mkdir(parents=True)
    (run / "documents" / "thesis.txt").write_text("years of work")
    with pytest.raises(ConfigError, match="already holds documents, which `kiln prepare` did not "
                       "write"):
        run_prepare(READ_WRITE, run, [str(tmp_path / "src")], progress=False)
    assert (run / "documents" / "thesis.txt").read_text() == "years of work"
    (run / "rejected").write_text("a file where prepare puts a folder")
    with pytest.raises(ConfigError, match="already holds documents, rejected, which"):
        run_prepare(READ_WRITE, run, [str(tmp_path / "src")], progress=False)
    # a folder Kiln's prepare wrote is replaced as before
    other = tmp_path / "run"
    run_prepare(READ_WRITE, other, [str(tmp_path / "src")], progress=False)
    (tmp_path / "src" / "b.txt").write_text("beta")
    assert run_prepare(READ_WRITE, other, [str(tmp_path / "src")], progress=False)["documents"] == 2


def test_a_json_list_record_without_text_is_counted_not_the_file_read_raw(tmp_path):
    records = [{"text": f"r{i}"} for i in range(5)] + [{"title": "x"}, "stray"]
    (tmp_path / "data.json").write_text(json.dumps(records))
    docs, counts = _read([tmp_path / "data.json"])
    assert [d.text for d in docs] == [f"r{i}" for i in range(5)]
    assert counts["skipped/no_text"] == 2
    # a list of objects none of which has the field is records too (it used to be read as
    # one document of JSON, unnamed): counted, as in JSON lines, not ingested as markup
    (tmp_path / "titles.json").write_text(json.dumps([{"name": "x"}, {"name": "y"}]))
    docs, counts = _read([tmp_path / "titles.json"])
    assert docs == [] and counts == {"skipped/no_text": 2}
    # a list that is not all objects has no record at all: text
    (tmp_path / "words.json").write_text(json.dumps(["x", {"name": "y"}]))
    docs, _ = _read([tmp_path / "words.json"])
    assert [d.text for d in docs] == ['["x", {"name": "y"}]']


def test_each_file_is_read_once_and_never_from_the_run_dir(tmp_path):
    """The same folder named twice (`d`, `d/`, a subfolder) gives each file once; a link in
    the source folder to the run directory does not make prepare read its own outputs."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (src / name).write_text(f"text of {name}")
    run = tmp_path / "run"
    (src / "runs").symlink_to(run, target_is_directory=True)
    sources = [str(src), f"{src}/", str(src / "sub"), str(src / "a.txt")]
    cfg = PrepareConfig(stages=["read", "write"], tasks=2)
    summary = run_prepare(cfg, run, sources, progress=False)
    assert _texts(run) == ["text of a.txt", "text of b.txt", "text of sub/c.txt"]
    assert summary["documents"] == 3
    (run / "notes.txt").write_text("the run's own file")  # as a tokenizer.json would be
    cfg = PrepareConfig(stages=["read", "write"], tasks=1)  # another layout: from scratch
    assert run_prepare(cfg, run, sources, progress=False)["documents"] == 3


def test_a_file_found_under_two_names_is_read_under_the_one_with_its_format(tmp_path):
    """A Hugging Face cache folder holds each file as blobs/<sha256>, linked from
    snapshots/<commit>/<name>; the blob comes first in path order, and read under its name
    (no suffix) its JSON lines were one text document of JSON syntax. The file is read once,
    as the JSON lines its link's name says it is."""
    cache = tmp_path / "datasets--org--name"
    (cache / "blobs").mkdir(parents=True)
    (cache / "snapshots" / "c0ffee" / "data").mkdir(parents=True)
    blob = cache / "blobs" / "9f2c0ab41e"
    blob.write_text('{"text": "first record"}\n{"text": "second record"}\n')
    link = cache / "snapshots" / "c0ffee" / "data" / "train.jsonl"
    link.symlink_to(blob)
    docs, counts = _read([cache])
    assert [(d.id, d.text) for d in docs] == [
        ("datasets--org--name/snapshots/c0ffee/data/train.jsonl:1", "first record"),
        ("datasets--org--name/snapshots/c0ffee/data/train.jsonl:2", "second record")]
    assert counts["documents"] == 2
    docs, _ = _read([link, blob])  # named the other way round: the same
    assert [d.text for d in docs] == ["first record", "second record"]


def test_the_content_cache_sees_an_edit_that_keeps_size_and_time(tmp_path):
    """The per-file hash cache is keyed by size, times and inode: an edit whose mtime is
    set back (`touch -r`, `cp -p`) is re-read; damaged entries are re-read, not trusted."""
    import os

    from kiln.data.sources import fingerprint_files

    f = tmp_path / "a.txt"
    f.write_text("original text")
    known: dict = {}
    before = fingerprint_files([str(tmp_path)], known=known)
    st = f.stat()
    f.write_text("ORIGINAL text")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = fingerprint_files([str(tmp_path)], known=known)
    assert edited["sha256"] != before["sha256"] and edited["bytes"] == before["bytes"]
    f.write_text("original text")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint_files([str(tmp_path)], known=known) == before
    key = next(iter(known))
    for damaged in ([st.st_size, st.st_mtime_ns], [*known[key][:4], None], "x"):
        known[key] = damaged
        assert fingerprint_files([str(tmp_path)], known=known) == before


def test_the_content_cache_keeps_only_the_files_read_now(tmp_path):
    """RUN/logs/source_hashes.json holds the files of the current sources: a source dropped
    from the config leaves the cache, and an unchanged fingerprint re-reads nothing."""
    import json

    from kiln.data import prepare_inputs
    from kiln.data.prepare_config import PrepareConfig

    a, b, run = tmp_path / "a", tmp_path / "b", tmp_path / "run"
    for d, n in ((a, 3), (b, 2)):
        d.mkdir()
        for i in range(n):
            (d / f"{i}.txt").write_text(f"{d.name} {i}")
    cfg = PrepareConfig(stages=["read", "write"], tasks=1)
    cache = run / "logs" / prepare_inputs.HASH_CACHE
    prepare_inputs.input_files(cfg, [str(a), str(b)], run)
    assert len(json.loads(cache.read_text())) == 5
    first = prepare_inputs.input_files(cfg, [str(b)], run)
    kept = json.loads(cache.read_text())
    assert sorted(kept) == sorted(str(p.resolve()) for p in b.iterdir())
    cache.write_text(json.dumps({k: [*v[:4], "not read again"] for k, v in kept.items()}))
    again = prepare_inputs.input_files(cfg, [str(b)], run)  # every entry reused, none re-read
    assert again != first and "not read again" in cache.read_text()


def test_a_folder_that_cannot_be_listed_is_counted_not_lost_in_silence(tmp_path, monkeypatch):
    """os.walk skips a folder it may not list unless told: its files would vanish from the
    corpus with no count. (As root, mode 000 lists anyway: the denial is simulated.)"""
    import os

    data = tmp_path / "data"
    (data / "secret").mkdir(parents=True)
    (data / "secret" / "doc3.txt").write_text("behind a closed door")
    (data / "doc1.txt").write_text("in the open")
    real_scandir = os.scandir

    def denying(path="."):
        if os.fspath(path).endswith("secret"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denying)
    docs, counts = _read([data])
    assert [d.text for d in docs] == ["in the open"]
    assert counts["skipped/unreadable_dir"] == 1


def test_damaged_prepared_documents_are_one_clear_error(tmp_path):
    """A documents/*.jsonl.gz cut short after prepare finished: tokenizer and tokenize read it
    through read_documents, which names the folder and the verb to re-run."""
    from kiln.errors import RunDataError

    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i}.txt").write_text(f"document {i} " + "words and more words " * 400)
    run = tmp_path / "run"
    run_prepare(READ_WRITE, run, [str(src)], progress=False)
    shard = sorted((run / "documents").glob("*.jsonl.gz"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(RunDataError, match="documents.*are damaged.*make them again: `kiln "
                       r"prepare --set prepare.resume=false`"):
        list(read_documents(run))
    run_prepare(READ_WRITE, run, [str(src)], progress=False)  # a plain re-run keeps them
    with pytest.raises(RunDataError):
        list(read_documents(run))
    import dataclasses

    run_prepare(dataclasses.replace(READ_WRITE, resume=False), run, [str(src)], progress=False)
    assert len(list(read_documents(run))) == 30  # what the message says does mend them
    assert not (run / "archive").exists()  # the same settings: the damaged copy is not kept


def _prepared_good_and_bad(tmp_path):
    """A source of two documents prepared into run/, and a source with nothing readable:
    (good, bad, run, the finished prepare.json)."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "a.txt").write_text("alpha")
    (good / "b.txt").write_text("beta")
    (bad / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    run = tmp_path / "run"
    run_prepare(READ_WRITE, run, [str(good)], progress=False)
    before = json.loads((run / "prepare.json").read_text())
    return good, bad, run, before


def test_a_remade_prepare_that_fails_leaves_the_earlier_documents_in_the_archive(tmp_path):
    """Re-making a finished prepare with a wrong source (nothing readable) must not throw
    the earlier documents away: they move to archive/before-prepare-*/, whole, and read back."""
    good, bad, run, before = _prepared_good_and_bad(tmp_path)
    with pytest.raises(NoDocumentsError, match="non_utf8=1"):
        run_prepare(READ_WRITE, run, [str(bad)], progress=False)
    (kept,) = (run / "archive").glob("before-prepare-*")
    assert json.loads((kept / "prepare.json").read_text()) == before
    assert _texts(kept) == ["alpha", "beta"]
    # the failed re-make wrote prepare.json but no documents/: nothing of it is archived
    run_prepare(READ_WRITE, run, [str(good)], progress=False)
    assert len(list((run / "archive").iterdir())) == 1 and _texts(run) == ["alpha", "beta"]


def test_an_interrupted_resume_still_leaves_the_finished_documents_to_the_archive(tmp_path,
                                                                               monkeypatch):
    """`kiln run` resumes prepare each time: one stopped early must not make the finished
    documents look unfinished, or a later prepare with other settings deletes them."""
    import kiln.data.pipeline as pipeline

    good, bad, run, before = _prepared_good_and_bad(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(pipeline, "make_executor", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_prepare(READ_WRITE, run, [str(good)], progress=False)
    assert json.loads((run / "prepare.json").read_text()) == before
    with pytest.raises(NoDocumentsError, match="non_utf8=1"):
        run_prepare(READ_WRITE, run, [str(bad)], progress=False)
    (kept,) = (run / "archive").glob("before-prepare-*")
    assert _texts(kept) == ["alpha", "beta"]


def test_a_prepare_that_keeps_little_warns_and_one_that_keeps_nothing_is_no_config_error(
        tmp_path, capsys):
    """Exit 0 with a warning naming the stage and reason when under a tenth survives; the
    reader skipping more than it reads is named too. Keeping nothing is an error of the data,
    not labelled a config error."""
    from kiln.cli import main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"same{i:02d}.txt").write_text("the same words in every file\n")
    for i in range(25):
        (src / f"latin{i:02d}.txt").write_bytes(b"caf\xe9\n")
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", f'data.sources=["{src}"]',
            "--set", 'prepare.stages=["read", "dedup_exact", "write"]', "--set", "prepare.tasks=1"]
    assert main(["prepare", *sets]) == 0
    err = capsys.readouterr().err
    assert "warning: the reader skipped 25 inputs and read 20 documents" in err
    assert "non_utf8=25" in err
    assert "warning: prepare kept 1 of the 20 documents it read (5.0%), dropped by dedup_exact:" \
        in err

    for path in src.glob("same*"):
        path.unlink()
    assert main(["prepare", *sets]) == 1
    err = capsys.readouterr().err
    assert "prepare read no documents" in err and "config error" not in err


def test_a_hugging_face_cache_reads_the_snapshots_not_its_bookkeeping(tmp_path):
    """Given as a source, a hub cache's `refs/main` (a one-line commit hash) was a document,
    as were a partial download in blobs/ and the cache root's `version.txt`. Only the files of
    the snapshots are read now; a `refs/` or `blobs/` folder of a user's own is still read."""
    hub = tmp_path / "hub"
    repo = hub / "datasets--org--name"
    for folder in ("blobs", "refs", "snapshots/c0ffee/data", ".no_exist/c0ffee"):
        (repo / folder).mkdir(parents=True)
    blob = repo / "blobs" / "9f2c0ab41e"
    blob.write_text('{"text": "first record"}\n{"text": "second record"}\n')
    (repo / "snapshots" / "c0ffee" / "data" / "train.jsonl").symlink_to(blob)
    (repo / "blobs" / "77aa01.incomplete").write_text('{"text": "half a rec')
    (repo / "blobs" / "9f2c0ab41e.lock").write_text("")
    (repo / "refs" / "main").write_text("c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00")
    (repo / ".no_exist" / "c0ffee" / "README.md").write_text("")
    (hub / "version.txt").write_text("1")
    for source in (hub, repo):
        docs, counts = _read([source])
        assert [d.text for d in docs] == ["first record", "second record"]
        assert not [k for k in counts if k.startswith("skipped/")]
    own = tmp_path / "notes"  # not a cache: its refs/ and version.txt are text like any other
    for folder in ("refs", "blobs", "snapshots"):
        (own / folder).mkdir(parents=True)
        (own / folder / "a.txt").write_text(f"{folder} text")
    (own / "version.txt").write_text("version notes")
    assert sorted(d.text for d in _read([own])[0]) == [
        "blobs text", "refs text", "snapshots text", "version notes"]


def test_the_hugging_face_home_given_whole_keeps_its_access_tokens_out(tmp_path):
    """`~/.cache/huggingface` given as a source: its `token` and `stored_tokens` (the user's
    access tokens) were read into the training data beside the hub's records. A `token`
    file of a user's own folder (no hub cache beside it) is still read."""
    home = tmp_path / "huggingface"
    snapshot = home / "hub" / "datasets--org--name" / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    (snapshot / "train.jsonl").write_text('{"text": "a record"}\n')
    (home / "token").write_text("hf_" + "Ab3" * 11)
    (home / "stored_tokens").write_text("[work]\nhf_token = hf_" + "Cd4" * 11 + "\n")
    docs, counts = _read([home])
    assert [d.text for d in docs] == ["a record"]
    assert not [k for k in counts if k.startswith("skipped/")]
    own = tmp_path / "notes"
    (own / "hub").mkdir(parents=True)  # a hub/ that is no cache
    (own / "token").write_text("a word on tokens")
    assert [d.text for d in _read([own])[0]] == ["a word on tokens"]


def test_an_access_token_is_kept_out_where_no_hub_cache_sits_beside_it(tmp_path):
    """A Hugging Face home with no hub cache yet (a login, the `datasets` library's cache:
    `~/.cache/huggingface` given whole), or a token file copied into a data folder: its
    `token` (one `hf_...` line) and `stored_tokens` were read into the training data, as
    only a `hub/` of cache repositories beside them marked them as the home's."""
    home = tmp_path / "huggingface"
    (home / "datasets").mkdir(parents=True)
    (home / "datasets" / "notes.txt").write_text("a datasets cache note")
    (home / "token").write_text("hf_" + "Ab3" * 11 + "\n")
    (home / "stored_tokens").write_text("[work]\nhf_token = hf_" + "Cd4" * 11 + "\n")
    assert [d.text for d in _read([home])[0]] == ["a datasets cache note"]
    own = tmp_path / "notes"  # a file named token that holds no access token is text
    own.mkdir()
    (own / "token").write_text("a word on tokens: hf_ is their prefix")
    assert [d.text for d in _read([own])[0]] == ["a word on tokens: hf_ is their prefix"]


def test_a_hub_cache_repository_reached_by_a_link_of_another_name_is_read_as_one(tmp_path):
    """A cache repository given through a link (`ln -s ~/.cache/huggingface/hub/
    datasets--org--name data`): the walk judged the folder by the link's name, so its
    `refs/main` (a commit hash) was read as a document."""
    repo = tmp_path / "hub" / "datasets--org--name"
    for folder in ("blobs", "refs", "snapshots/c0ffee"):
        (repo / folder).mkdir(parents=True)
    blob = repo / "blobs" / "9f2c0ab41e"
    blob.write_text('{"text": "a record"}\n')
    (repo / "snapshots" / "c0ffee" / "train.jsonl").symlink_to(blob)
    (repo / "refs" / "main").write_text("c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00")
    link = tmp_path / "data"
    link.symlink_to(repo)
    docs, counts = _read([link])
    assert [d.text for d in docs] == ["a record"]
    assert not [k for k in counts if k.startswith("skipped/")]
