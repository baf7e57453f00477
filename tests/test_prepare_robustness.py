"""Prepare on bad input: one bad JSONL line, a corpus that yields nothing, a source that grows."""

import json

import pytest

from kiln.config import ConfigError
from kiln.data.documents import SourceReader, prepare_documents, read_documents
from kiln.data.pipeline import PrepareConfig, run_prepare


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
    summary = prepare_documents([str(tmp_path / "s.jsonl")], tmp_path / "run")
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
    with pytest.raises(ConfigError, match=rf"data.sources: prepare read no documents.*{reason}=3"):
        prepare_documents([str(src)], tmp_path / "run")
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
    with pytest.raises(ConfigError, match="empty=1"):
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
