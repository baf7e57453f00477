"""Compressed sources beyond gzip: `.bz2`, `.xz` (standard library) and `.zst` (zstandard)
are read like `.gz`, not counted as `binary` and lost; a cut or damaged one keeps the records
read before the damage, counted `unreadable_rest_of_file` with the file and line, as a cut
`.jsonl.gz` is. A cut compressed text keeps its text before the cut, counted the same way;
a damaged one (its bytes before the damage may be garbage) is `unreadable`."""

import bz2
import gzip
import json
import lzma

import pytest
import zstandard

from kiln.data.documents import SourceReader

# bz2 at level 1: 100 kB blocks, so a cut half-way has whole blocks before it (a block is
# decompressed whole or not at all)
COMPRESSORS = {".bz2": lambda raw: bz2.compress(raw, 1), ".xz": lzma.compress,
               ".zst": zstandard.compress}
WITH_GZIP = {".gz": gzip.compress, **COMPRESSORS}


def _read(*sources):
    reader = SourceReader([str(s) for s in sources], progress=False)
    docs = list(reader.run())
    return docs, dict(reader.counts), reader.examples.to_json()


def _lines(n):
    return "".join(json.dumps({"text": f"r{i} " + "word " * (i % 7)}) + "\n"
                   for i in range(n)).encode()


@pytest.mark.parametrize("suffix", COMPRESSORS)
@pytest.mark.parametrize("base", [".jsonl", ".ndjson"])
def test_compressed_json_lines_are_read(tmp_path, suffix, base):
    (tmp_path / f"d{base}{suffix}").write_bytes(COMPRESSORS[suffix](_lines(50)))
    docs, counts, _ = _read(tmp_path)
    assert [d.text.split()[0] for d in docs] == [f"r{i}" for i in range(50)]
    assert not any(k.startswith("skipped/") for k in counts)


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_compressed_text_is_read(tmp_path, suffix):
    (tmp_path / f"notes.txt{suffix}").write_bytes(COMPRESSORS[suffix]("plain text é".encode()))
    docs, _, _ = _read(tmp_path)
    assert [(d.id, d.text) for d in docs] == [(f"{tmp_path.name}/notes.txt{suffix}", "plain text é")]


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_a_cut_compressed_jsonl_keeps_what_came_before(tmp_path, suffix):
    blob = COMPRESSORS[suffix](_lines(20_000))
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(blob[:len(blob) // 2])
    docs, counts, examples = _read(tmp_path / f"cut.jsonl{suffix}")
    assert 0 < len(docs) < 20_000
    assert [d.text.split()[0] for d in docs] == [f"r{i}" for i in range(len(docs))]
    assert counts["skipped/unreadable_rest_of_file"] == 1
    example = examples["unreadable_rest_of_file"]["examples"][0]
    assert example["file"].endswith(f"cut.jsonl{suffix}") and example["line"] == len(docs) + 1


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_damaged_compressed_files_are_counted_not_fatal(tmp_path, suffix):
    """Bytes zeroed mid-stream: lzma raises LZMAError, neither an OSError nor an EOFError."""
    blob = bytearray(COMPRESSORS[suffix](_lines(20_000)))
    middle = len(blob) // 2
    blob[middle:middle + 200] = bytes(200)
    (tmp_path / f"bad.jsonl{suffix}").write_bytes(bytes(blob))
    (tmp_path / f"bad.txt{suffix}").write_bytes(bytes(blob))
    (tmp_path / "good.txt").write_text("fine")
    docs, counts, _ = _read(tmp_path)
    assert counts["skipped/unreadable"] == 1  # the text file: one document, damaged
    assert counts["skipped/unreadable_rest_of_file"] == 1  # the JSON lines, their start kept
    assert "fine" in {d.text for d in docs} and len(docs) > 1


@pytest.mark.parametrize("suffix", WITH_GZIP)
def test_a_cut_compressed_text_keeps_its_text_before_the_cut(tmp_path, suffix):
    """A truncated download of one text: the text before the cut is what was written; it was
    counted `unreadable` whole, its readable part lost. Kept now, and named with the line
    where it was cut, so the user sees the document is partial."""
    text = _lines(20_000).decode()
    blob = WITH_GZIP[suffix](text.encode())
    (tmp_path / f"cut.txt{suffix}").write_bytes(blob[:len(blob) // 2])
    docs, counts, examples = _read(tmp_path)
    (doc,) = docs
    assert 0 < len(doc.text) < len(text) and text.startswith(doc.text)
    assert doc.id == f"{tmp_path.name}/cut.txt{suffix}"
    assert counts["skipped/unreadable_rest_of_file"] == 1 and "skipped/unreadable" not in counts
    (example,) = examples["unreadable_rest_of_file"]["examples"]
    assert example["file"].endswith(f"cut.txt{suffix}")
    assert example["line"] == doc.text.count("\n") + 1


def test_a_text_cut_inside_a_character_keeps_the_characters_before_it(tmp_path):
    """The cut falls inside "é" (two bytes in UTF-8): the whole text was `non_utf8`."""
    path = tmp_path / "cut.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write("line one\ncafé\ncaf".encode() + "é".encode()[:1])
        f.flush()  # a sync flush: the bytes so far decode from the file's start
        cut = f.fileobj.tell()
        f.write("é".encode()[1:] + b" and more text\n" * 100)
    path.write_bytes(path.read_bytes()[:cut])
    docs, counts, examples = _read(path)
    assert [d.text for d in docs] == ["line one\ncafé\ncaf"]
    assert examples["unreadable_rest_of_file"]["examples"][0]["line"] == 3
    assert set(counts) == {"documents", "bytes", "skipped/unreadable_rest_of_file"}


@pytest.mark.parametrize("suffix", WITH_GZIP)
def test_a_compressed_text_cut_before_its_text_is_named_once(tmp_path, suffix):
    """Cut inside its header: nothing to keep, and the file is not also called `empty`."""
    (tmp_path / f"cut.txt{suffix}").write_bytes(WITH_GZIP[suffix](b"some text")[:6])
    docs, counts, examples = _read(tmp_path)
    assert docs == [] and set(counts) == {"skipped/unreadable_rest_of_file"}
    assert examples["unreadable_rest_of_file"]["examples"][0]["line"] == 1


@pytest.mark.parametrize("suffix", WITH_GZIP)
def test_compressed_json_is_read_as_json(tmp_path, suffix):
    """`.json.gz` is how C4 (allenai/c4) ships its JSON lines; a compressed list of records
    or a compressed package.json is read as its `.json` would be (they were `binary`)."""
    (tmp_path / f"c4-train.00000-of-01024.json{suffix}").write_bytes(
        WITH_GZIP[suffix](_lines(30)))
    (tmp_path / f"list.json{suffix}").write_bytes(WITH_GZIP[suffix](json.dumps(
        {"data": [{"text": f"item {i}", "id": i} for i in range(3)]}).encode()))
    (tmp_path / f"package.json{suffix}").write_bytes(WITH_GZIP[suffix](b'{"name": "x"}'))
    docs, counts, _ = _read(tmp_path)
    by_file = {}
    for d in docs:
        by_file.setdefault(d.metadata["source"].rsplit("/", 1)[-1], []).append(d.text)
    assert by_file[f"c4-train.00000-of-01024.json{suffix}"] == [
        json.loads(line)["text"] for line in _lines(30).decode().splitlines()]
    assert by_file[f"list.json{suffix}"] == ["item 0", "item 1", "item 2"]
    assert by_file[f"package.json{suffix}"] == ['{"name": "x"}']
    assert not any(k.startswith("skipped/") for k in counts)
