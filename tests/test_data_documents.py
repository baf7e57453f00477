"""Raw sources -> Documents: formats, skip accounting, the stdlib default corpus."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.data.documents import SourceReader, read_documents
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.sources import stdlib_root


def _read(sources, **kw):
    reader = SourceReader([str(s) for s in sources], progress=False, **kw)
    return list(reader.run()), dict(reader.counts)


def test_txt_one_doc_per_file_with_exact_text(tmp_path):
    (tmp_path / "b.txt").write_bytes("héllo\r\nworld  ".encode())
    (tmp_path / "a.txt").write_text("first")
    docs, counts = _read([tmp_path])
    assert [d.id for d in docs] == [f"{tmp_path.name}/a.txt", f"{tmp_path.name}/b.txt"]
    assert docs[1].text == "héllo\r\nworld  "
    assert docs[1].metadata == {"source": str(tmp_path / "b.txt"), "bytes": 15}
    assert counts == {"documents": 2, "bytes": 20}


def test_jsonl_lines_bad_lines_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [
        json.dumps({"text": "one"}).encode(),
        b"{not json",
        json.dumps({"title": "no text"}).encode(),
        json.dumps({"text": ""}).encode(),
        b'{"text": "caf\xe9"}',  # latin-1 byte: not UTF-8
        b"",
        json.dumps({"text": "two"}).encode(),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    docs, counts = _read([path])
    assert [(d.id, d.text) for d in docs] == [("d.jsonl:1", "one"), ("d.jsonl:7", "two")]
    assert counts == {
        "documents": 2,
        "bytes": 6,
        "skipped/bad_json": 1,
        "skipped/no_text": 1,
        "skipped/empty": 1,
        "skipped/non_utf8": 1,
    }


def test_jsonl_gz(tmp_path):
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "zipped"}) + "\n")
    docs, _ = _read([tmp_path / "d.jsonl.gz"])
    assert [d.text for d in docs] == ["zipped"]


def test_parquet_rows(tmp_path):
    table = pa.table({"text": ["alpha", None, "beta", " "], "n": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "p.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "q.parquet")
    docs, counts = _read([tmp_path / "p.parquet", tmp_path / "q.parquet"])
    assert [(d.id, d.text) for d in docs] == [("p.parquet:0", "alpha"), ("p.parquet:2", "beta")]
    assert counts["skipped/no_text"] == 1
    assert counts["skipped/empty"] == 1
    assert counts["skipped/no_text_column"] == 1


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_a_parquet_row_of_invalid_utf8_is_one_skipped_row(tmp_path, kind):
    """Writers outside pyarrow rarely check a string column's UTF-8: the bad row is counted
    and skipped, and the rows after it in its batch and in later batches are read."""
    rows = [f"row {i} text".encode() for i in range(2500)]
    rows[1030] = b"bad \xff row"
    raw = pa.binary() if kind == pa.string() else pa.large_binary()
    pq.write_table(pa.table({"text": pa.array(rows, raw).view(kind)}), tmp_path / "p.parquet")
    docs, counts = _read([tmp_path / "p.parquet"])
    assert len(docs) == 2499 and counts["skipped/non_utf8"] == 1
    assert "skipped/unreadable" not in counts
    assert (docs[1030].id, docs[1030].text) == ("p.parquet:1031", "row 1031 text")


def test_bad_files_counted_and_skipped(tmp_path):
    (tmp_path / "latin.py").write_bytes("# caf\xe9\n".encode("latin-1"))
    (tmp_path / "empty.md").write_text("  \n")
    (tmp_path / "blob.dat").write_bytes(b"\x00\x01\x02")
    (tmp_path / "img.png").write_bytes(b"\x89PNG")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    (tmp_path / "ok.c").write_text("int main;")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.txt").write_text("cache")
    docs, counts = _read([tmp_path])
    assert [d.text for d in docs] == ["int main;"]
    assert counts == {
        "documents": 1,
        "bytes": 9,
        "skipped/non_utf8": 1,
        "skipped/empty": 1,
        "skipped/binary": 2,
        "skipped/unreadable": 1,
    }


def test_missing_source_names_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        SourceReader([str(missing)])


def test_rank_sharding_by_file(tmp_path):
    for i in range(5):
        (tmp_path / f"{i}.txt").write_text(f"doc {i}")
    r0 = SourceReader([str(tmp_path)], progress=False)
    r1 = SourceReader([str(tmp_path)], progress=False)
    ids0 = [d.text for d in r0.run(None, rank=0, world_size=2)]
    ids1 = [d.text for d in r1.run(None, rank=1, world_size=2)]
    assert ids0 == ["doc 0", "doc 2", "doc 4"]
    assert ids1 == ["doc 1", "doc 3"]


def test_stdlib_default_corpus(tmp_path):
    docs, counts = _read([], max_bytes=300_000)
    assert len(docs) >= 5
    assert 300_000 <= counts["bytes"] < 300_000 + max(d.metadata["bytes"] for d in docs)
    ids = [d.id for d in docs]
    assert ids == sorted(ids)
    assert all(i.endswith(".py") for i in ids)
    assert (stdlib_root() / ids[0]).is_file()


def test_stdlib_corpus_skips_tests_and_packages():
    from kiln.data.sources import stdlib_files

    rels = [f.rel for f in stdlib_files()]
    assert len(rels) > 300
    assert "os.py" in rels and "json/decoder.py" in rels
    banned = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    assert not [r for r in rels if banned & set(r.split("/")[:-1])]


def test_prepare_and_read_back(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha")
    (src / "b.jsonl").write_text('{"text": "beta"}\nnot json\n')
    (src / "c.txt").write_bytes(b"\xe9t\xe9")  # latin-1: not UTF-8
    cfg = PrepareConfig(stages=["read", "write"])
    summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    assert summary["documents"] == 2 and summary["bytes"] == 9
    assert summary["skipped"] == {"bad_json": 1, "non_utf8": 1}
    assert json.loads((tmp_path / "run" / "prepare.json").read_text()) == summary
    docs = list(read_documents(tmp_path / "run"))
    assert [(d.id, d.text) for d in docs] == [("src/a.txt", "alpha"), ("src/b.jsonl:1", "beta")]
    assert docs[0].metadata == {"source": str(src / "a.txt"), "bytes": 5}
    # a second run replaces the first instead of being skipped as "completed"
    (src / "a.txt").write_text("changed")
    assert run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)["bytes"] == 11


def test_read_documents_without_prepare(tmp_path):
    with pytest.raises(FileNotFoundError, match="kiln prepare"):
        list(read_documents(tmp_path))
