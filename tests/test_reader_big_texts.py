"""A text file too large to hold (a 5-20 GB book dump) is read in bounded chunks: a 500 MB
one-line .txt peaked at 1 GB (its bytes and its text; a .txt.gz at 3x its size), so such a
dump ran out of memory. Read in chunks it gives the same documents (ids, parts, `part_of`,
counts, the line where a cut one was cut) as read whole, and is checked whole first, as
before: a NUL byte, invalid UTF-8 or damage anywhere in it still loses all of it."""

import bz2
import gzip
import lzma
import random
import tracemalloc

import pytest
import zstandard

from kiln.data import text_files
from kiln.data.documents import SourceReader
from kiln.data.long_documents import split_long_text, split_text_stream

MAX_DOCUMENT_CHARS = 1_000_000
COMPRESS = {"": lambda raw: raw, ".gz": gzip.compress, ".bz2": lambda raw: bz2.compress(raw, 1),
            ".xz": lzma.compress, ".zst": zstandard.compress}


def _read(path):
    reader = SourceReader([str(path)], progress=False)
    docs = [(d.id, d.text, d.metadata) for d in reader.run()]
    return docs, dict(reader.counts), reader.examples.to_json()


def _streamed(monkeypatch, path, read_bytes=4099):
    """`_read` with every file over 64 bytes read in chunks of `read_bytes` (odd: chunks end
    inside characters of several bytes)."""
    with monkeypatch.context() as m:
        m.setattr(text_files, "WHOLE_TEXT_BYTES", 64, raising=False)
        m.setattr(text_files, "READ_BYTES", read_bytes, raising=False)
        return _read(path)


def _prose(n_chars, seed=0, breaks=True):
    rng = random.Random(seed)
    words = "the of and to in is kiln réseau 数据 𝔘𝔫𝔦 ok".split()
    out, size = [], 0
    while size < n_chars:
        s = " ".join(rng.choices(words, k=rng.randint(5, 30)))
        s += (".\n\n" if rng.random() < 0.02 else ".\n" if rng.random() < 0.1 else ". ") \
            if breaks else " "
        out.append(s)
        size += len(s)
    return "".join(out)


TEXTS = {
    "prose": lambda: _prose(int(2.5 * MAX_DOCUMENT_CHARS)).encode(),
    "one_line": lambda: _prose(int(1.6 * MAX_DOCUMENT_CHARS), 1, breaks=False).encode(),
    "no_breaks": lambda: ("x" * 1_200_000 + "é" * 900_000).encode(),
    "utf8_bom": lambda: b"\xef\xbb\xbf" + _prose(1_300_000, 2).encode(),
    "utf16": lambda: _prose(1_100_000, 3).encode("utf-16"),
    "crlf": lambda: _prose(1_500_000, 4).replace("\n", "\r\n").encode(),
    "short": lambda: "a short text, café\n".encode() * 30,
    "blank": lambda: b" \n\t" * 100,
    "late_nul": lambda: _prose(1_200_000, 5).encode() + b"\x00 then text",
    "late_bad_utf8": lambda: _prose(1_200_000, 6).encode() + b"\xff then text",
    "bom_bad_utf8_mid_line": lambda: (b"\xef\xbb\xbf" + _prose(1_200_000, 8).encode()
                                      + b"\nthe caf\xe9 line\n" + _prose(9_000, 9).encode()),
    "ends_inside_a_character": lambda: _prose(1_200_000, 7).encode() + "é".encode()[:1],
    "utf32": lambda: "some text".encode("utf-32") * 10,
}


@pytest.mark.parametrize("name", TEXTS)
def test_a_text_read_in_chunks_gives_the_documents_it_gives_read_whole(tmp_path, monkeypatch,
                                                                       name):
    path = tmp_path / f"{name}.txt"
    path.write_bytes(TEXTS[name]())
    assert path.stat().st_size <= text_files.WHOLE_TEXT_BYTES  # read whole, in one piece
    whole = _read(path)
    assert _streamed(monkeypatch, path) == whole
    if name in ("prose", "one_line", "no_breaks"):
        assert whole[1]["parts"] >= 2


@pytest.mark.parametrize("suffix", [s for s in COMPRESS if s])
def test_a_compressed_text_read_in_chunks_gives_the_same_documents(tmp_path, monkeypatch,
                                                                   suffix):
    path = tmp_path / f"dump.txt{suffix}"
    path.write_bytes(COMPRESS[suffix](TEXTS["prose"]()))
    whole = _read(path)
    assert whole[1]["parts"] == 3
    assert _streamed(monkeypatch, path, read_bytes=1 << 20) == whole


@pytest.mark.parametrize("suffix", [s for s in COMPRESS if s])
def test_a_cut_compressed_text_read_in_chunks_keeps_the_same_text_and_line(
        tmp_path, monkeypatch, suffix):
    """A truncated download: the text before the cut, as parts, and the line of the cut."""
    blob = COMPRESS[suffix](TEXTS["prose"]())
    path = tmp_path / f"cut.txt{suffix}"
    path.write_bytes(blob[:len(blob) * 3 // 4])
    whole = _read(path)
    assert whole[1]["skipped/unreadable_rest_of_file"] == 1 and whole[0]
    assert _streamed(monkeypatch, path, read_bytes=1 << 20) == whole


def test_a_text_damaged_at_its_end_loses_all_of_it_read_in_chunks_too(tmp_path, monkeypatch):
    """gzip checks its CRC at the end: every part before it may be garbage, none is kept."""
    blob = bytearray(gzip.compress(TEXTS["prose"]()))
    blob[-8] ^= 0xFF  # the CRC
    path = tmp_path / "damaged.txt.gz"
    path.write_bytes(bytes(blob))
    whole = _read(path)
    assert whole[0] == [] and whole[1] == {"skipped/unreadable": 1}
    assert _streamed(monkeypatch, path, read_bytes=1 << 20) == whole


@pytest.mark.parametrize("limit", [2, 3, 4, 10, 57, 100])
def test_split_text_stream_cuts_where_split_long_text_does(limit):
    """Where the end of the text is near (a rest of at most 1.5 x the limit) the rest is cut
    near its middle (no short last part): the stream must hold that much to know it."""
    rng = random.Random(limit)
    for _ in range(200):
        alphabet = rng.choice(["ab \n\t.é", "abcdefgh \n", "abcdefghijklmnop\n", "abc"])
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8 * limit)))
        top = rng.choice([1, 30, 2 * limit])
        sizes = [rng.randint(0, top) for _ in range(rng.randint(1, 10 * limit))]
        chunks, at = [], 0
        for size in sizes:
            chunks.append(text[at:at + size])
            at += size
        chunks.append(text[at:])
        parts = list(split_text_stream(chunks, limit))
        assert parts == list(split_long_text(text, limit))
        assert "".join(parts) == text
        assert len(text) <= limit or all(limit <= 4 * len(p) and len(p) <= limit for p in parts)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_reading_a_large_text_holds_a_few_parts_not_the_file(tmp_path, suffix):
    """The memory the read takes (Python's allocations, traced) stays under 16 MB for a
    32 MB text (about 9 MB: the first 4 MiB, read to see whether it is larger, then a chunk,
    its text and a part or two, whatever the file's size): read whole, its bytes and its
    text took twice its size (three times for a .txt.gz: the decompressed chunks, their join
    and the text)."""
    size = 32 << 20
    line = (" ".join(["kiln", "réseau", "words"] * 40) + "\n").encode()
    raw = line * (size // len(line))
    path = tmp_path / f"big.txt{suffix}"
    path.write_bytes(gzip.compress(raw, 1) if suffix else raw)
    del raw
    reader = SourceReader([str(path)], progress=False)
    tracemalloc.start()
    try:
        n_chars = sum(len(doc.text) for doc in reader.run())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n_chars > 30 * MAX_DOCUMENT_CHARS and reader.counts["parts"] > 30
    assert peak < size // 2, f"reading a {size:,}-byte text took {peak:,} bytes"
