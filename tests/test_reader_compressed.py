"""Compressed sources beyond gzip: `.bz2` and `.xz` (standard library) are read like `.gz`,
not counted as `binary` and lost; a cut or damaged one keeps the records read before the
damage, counted `unreadable_rest_of_file` with the file and line, as a cut `.jsonl.gz` is."""

import bz2
import json
import lzma

import pytest

from kiln.data.documents import SourceReader

# bz2 at level 1: 100 kB blocks, so a cut half-way has whole blocks before it (a block is
# decompressed whole or not at all)
COMPRESSORS = {".bz2": lambda raw: bz2.compress(raw, 1), ".xz": lzma.compress}


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
