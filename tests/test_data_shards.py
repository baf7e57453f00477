"""Token shards: deterministic split by document, exact token content, dtype, unigram baseline."""

import json
import math
from collections import Counter

import numpy as np
import pytest
from conftest import gpt2_byte_symbols
from datatrove.data import Document

from kiln.data.shards import load_index, split_hash, token_dtype, write_shards
from kiln.data.tokenizer import train_tokenizer

DOCS = [
    Document(text=f"def f{i}(x):\n    return x * {i} + {i % 7}\n", id=f"doc{i}") for i in range(200)
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer([d.text for d in DOCS], 320, path, show_progress=False)


def _tokens(out_dir, index, split):
    dtype = np.dtype(index["dtype"])
    files = [out_dir / s["file"] for s in index[split]["shards"]]
    return np.concatenate([np.fromfile(f, dtype=dtype) for f in files] or [np.zeros(0, dtype)])


def _split_docs(tokens, eos):
    """Token stream -> list of per-document tuples (EOS included)."""
    ends = np.flatnonzero(tokens == eos)
    return [tuple(d) for d in np.split(tokens, ends + 1)[:-1]]


def test_token_dtype_selection():
    assert token_dtype(256) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    assert token_dtype(65537).byteorder in ("<", "=")


def test_split_hash_is_stable():
    assert split_hash(0, "a") == split_hash(0, "a")
    assert split_hash(0, "a") != split_hash(1, "a")
    # pinned value: a change of hash function would silently reshuffle every split
    assert split_hash(0, "doc0") == pytest.approx(0.7815605936401102, abs=1e-12)


def test_stream_equals_encodings_in_order(tok, tmp_path):
    index = write_shards(DOCS, tok, tmp_path, val_fraction=0.0, shard_tokens=100, progress=False)
    expected = np.concatenate([[*tok.encode(d.text).ids, 0] for d in DOCS])
    got = _tokens(tmp_path, index, "train")
    assert np.array_equal(got, expected)
    shards = index["train"]["shards"]
    assert len(shards) == math.ceil(len(expected) / 100)
    assert all(s["tokens"] == 100 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 100
    assert (tmp_path / "train_00000.bin").stat().st_size == 200  # uint16
    assert index["val"] == {"shards": [], "documents": 0, "tokens": 0, "bytes": 0}
    assert index["unigram_bpb"] is None


def test_split_by_document_deterministic(tok, tmp_path):
    a = write_shards(DOCS, tok, tmp_path / "a", val_fraction=0.2, seed=3, progress=False)
    b = write_shards(DOCS, tok, tmp_path / "b", val_fraction=0.2, seed=3, progress=False)
    c = write_shards(DOCS, tok, tmp_path / "c", val_fraction=0.2, seed=4, progress=False)
    assert a == b
    for split in ("train", "val"):
        assert np.array_equal(_tokens(tmp_path / "a", a, split), _tokens(tmp_path / "b", b, split))
    val_a = set(_split_docs(_tokens(tmp_path / "a", a, "val"), 0))
    val_c = set(_split_docs(_tokens(tmp_path / "c", c, "val"), 0))
    assert val_a != val_c

    # exactly the documents whose hash falls under the fraction, each whole, none in both splits
    enc = {d.id: (*tok.encode(d.text).ids, 0) for d in DOCS}
    want_val = [enc[d.id] for d in DOCS if split_hash(3, d.id) < 0.2]
    want_train = [enc[d.id] for d in DOCS if split_hash(3, d.id) >= 0.2]
    assert 20 < len(want_val) < 60
    assert _split_docs(_tokens(tmp_path / "a", a, "val"), 0) == want_val
    assert sorted(_split_docs(_tokens(tmp_path / "a", a, "train"), 0)) == sorted(want_train)
    for split, docs in (("train", want_train), ("val", want_val)):
        s = a[split]
        assert s["documents"] == len(docs)
        assert s["tokens"] == sum(map(len, docs))
    assert a["val"]["bytes"] == sum(len(d.text.encode()) for d in DOCS if split_hash(3, d.id) < 0.2)


def test_at_least_one_val_doc(tok, tmp_path):
    docs = DOCS[:2]
    index = write_shards(docs, tok, tmp_path, val_fraction=1e-12, progress=False)
    assert index["val"]["documents"] == 1
    assert index["train"]["documents"] == 1
    smallest = min(docs, key=lambda d: split_hash(0, d.id))
    assert index["val"]["bytes"] == len(smallest.text.encode())
    one = write_shards(DOCS[:1], tok, tmp_path / "one", val_fraction=1e-12, progress=False)
    assert one["val"]["documents"] == 0 and one["train"]["documents"] == 1


def test_at_least_one_train_doc(tok, tmp_path):
    """A val_fraction that takes every document would leave nothing to train on (and a
    unigram baseline of no counts): the last val document in stream order goes to train;
    the others keep their places."""
    docs = DOCS[:3]
    index = write_shards(docs, tok, tmp_path / "three", val_fraction=0.999999, progress=False)
    assert (index["train"]["documents"], index["val"]["documents"]) == (1, 2)
    assert index["train"]["bytes"] == len(docs[-1].text.encode())
    enc = [(*tok.encode(d.text).ids, 0) for d in docs]
    assert _split_docs(_tokens(tmp_path / "three", index, "val"), 0) == enc[:2]
    one = write_shards(DOCS[:1], tok, tmp_path / "one", val_fraction=0.999999, progress=False)
    assert one["train"]["documents"] == 1 and one["val"]["documents"] == 0


def test_unigram_bpb_matches_reference(tok, tmp_path):
    docs = DOCS[:40]
    index = write_shards(docs, tok, tmp_path, val_fraction=0.25, seed=1, progress=False)
    train = Counter(_tokens(tmp_path, index, "train").tolist())
    val = _tokens(tmp_path, index, "val").tolist()
    n_train, vocab = sum(train.values()), tok.get_vocab_size()
    bits = sum(-math.log2((train[t] + 1) / (n_train + vocab)) for t in val)
    val_bytes = sum(len(d.text.encode()) for d in docs if split_hash(1, d.id) < 0.25)
    assert index["val"]["bytes"] == val_bytes
    assert index["unigram_bpb"] == pytest.approx(bits / val_bytes, rel=1e-12)
    assert 0.5 < index["unigram_bpb"] < 8.0


def test_large_vocab_uses_uint32(tmp_path):
    tok = train_tokenizer(["aaa bbb"] * 3, 260, tmp_path / "t.json", show_progress=False)
    tok.add_tokens([f"tok{i:05d}" for i in range(65600)])
    assert tok.get_vocab_size() > 65536
    index = write_shards(DOCS[:3], tok, tmp_path / "s", val_fraction=0.0, progress=False)
    assert index["dtype"] == "uint32"
    tokens = index["train"]["tokens"]
    assert (tmp_path / "s" / "train_00000.bin").stat().st_size == 4 * tokens


def test_index_written_and_stale_files_removed(tok, tmp_path):
    write_shards(DOCS, tok, tmp_path, val_fraction=0.1, shard_tokens=50, progress=False)
    index = write_shards(DOCS[:5], tok, tmp_path, val_fraction=0.0, progress=False)
    assert load_index(tmp_path) == index == json.loads((tmp_path / "index.json").read_text())
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["train_00000.bin"]
    assert index["eos_id"] == 0 and index["vocab_size"] == tok.get_vocab_size()


def test_load_index_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="kiln tokenize"):
        load_index(tmp_path)


def test_token_byte_table_sums_to_each_splits_text_bytes(tok, tmp_path):
    """token_bytes.npy gives the UTF-8 bytes of each id (EOS: 0); over a split's tokens it
    sums to the bytes of the split's text, so any part of a split has exact bytes too."""
    from kiln.data.shards import load_token_bytes

    docs = [*DOCS[:30], Document(text="naïve — 東京 🚀 <|endoftext|>\r\n\x00", id="odd")]
    index = write_shards(docs, tok, tmp_path, val_fraction=0.3, seed=2, progress=False)
    table = load_token_bytes(tmp_path)
    assert table[index["eos_id"]] == 0 and table.shape == (tok.get_vocab_size(),)
    for split in ("train", "val"):
        assert table[_tokens(tmp_path, index, split)].sum() == index[split]["bytes"] > 0
    assert np.array_equal(table, reference_token_bytes(tok))


def token_bytes_of(tok, token_id: int) -> bytes:
    symbols = gpt2_byte_symbols()
    return bytes(symbols[c] for c in tok.id_to_token(token_id))


def reference_token_bytes(tok) -> np.ndarray:
    """Each id's UTF-8 bytes from its symbols (EOS, the one special token: none)."""
    return np.array([0 if i == tok.token_to_id("<|endoftext|>") else len(token_bytes_of(tok, i))
                     for i in range(tok.get_vocab_size())])


UNICODE_DOCS = [Document(text=t, id=f"u{i}") for i, t in enumerate(
    ["naïve café — résumé ", "東京都 東京タワー 東京 ", "🚀🚀 launch 🚀 ", "Ελληνικά ελληνικά ",
     "e\u0301e\u0301 ", "日本語の文章 "] * 30)]


def test_token_byte_table_counts_multi_byte_and_partial_pieces(tmp_path):
    """Merged non-ASCII pieces: whole characters of 2-4 bytes, several characters, and parts
    of characters (a lead byte and some of its continuation bytes, or the end of one and the
    start of the next), which decode to U+FFFD alone. Each id's count equals its bytes, and a
    document's tokens' bytes joined are its UTF-8, so bits per byte divides by exact bytes
    whatever the pieces."""
    from kiln.data.shards import load_token_bytes

    tok = train_tokenizer([d.text for d in UNICODE_DOCS], 400, tmp_path / "tok.json",
                          show_progress=False)
    index = write_shards(UNICODE_DOCS, tok, tmp_path, val_fraction=0.2, seed=1, progress=False)
    table = load_token_bytes(tmp_path)
    assert np.array_equal(table, reference_token_bytes(tok))
    pieces = {i: token_bytes_of(tok, i) for i in range(1, tok.get_vocab_size())}

    def whole(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    assert any(len(b) == 4 and whole(b) for b in pieces.values())  # 🚀
    assert any(len(b) >= 6 and not b.isascii() and whole(b) for b in pieces.values())  # 東京
    partial = [i for i, b in pieces.items() if len(b) > 1 and not whole(b)]
    assert partial and all("\ufffd" in tok.decode([i]) for i in partial)  # checked above too
    for doc in UNICODE_DOCS[:6]:
        ids = tok.encode(doc.text).ids
        assert b"".join(pieces[i] for i in ids) == doc.text.encode("utf-8")
        assert table[ids].sum() == len(doc.text.encode("utf-8"))
    for split in ("train", "val"):
        assert table[_tokens(tmp_path, index, split)].sum() == index[split]["bytes"] > 0


def test_the_parts_of_a_cut_text_land_on_one_side_of_the_split(tok, tmp_path):
    """The reader cuts a text over its limit into parts `<id>#k` with `part_of` = the text's
    id (kiln.data.long_documents): split by their own ids, neighbouring parts of one text
    would be in train and val alike, and the val loss would be measured on text trained on."""
    parts = [Document(text=f"def part{k}(y):\n    return y - {k}\n", id=f"dump.txt#{k}",
                      metadata={"part_of": "dump.txt"}) for k in range(1, 41)]
    assert {split_hash(5, p.id) < 0.3 for p in parts} == {True, False}  # by own id: both sides
    index = write_shards(DOCS + parts, tok, tmp_path, val_fraction=0.3, seed=5, progress=False)
    eos = 0
    val = set(_split_docs(_tokens(tmp_path, index, "val"), eos))
    in_val = [tuple([*tok.encode(p.text).ids, eos]) in val for p in parts]
    assert len(set(in_val)) == 1, f"{sum(in_val)} of {len(parts)} parts in val"
    assert in_val[0] == (split_hash(5, "dump.txt") < 0.3)


def _cut_text(name, n_parts):
    return [Document(text=f"def {name}{k}(y):\n    return y - {k}\n", id=f"{name}#{k}",
                     metadata={"part_of": name}) for k in range(1, n_parts + 1)]


@pytest.mark.parametrize("memory_tokens", [1 << 22, 5])
def test_a_cut_text_moved_to_fill_an_empty_split_moves_whole(tok, tmp_path, monkeypatch,
                                                              memory_tokens):
    """When no text hashes into val, the train text with the smallest hash moves there; when
    every text does, the last val text moves to train. A cut text moved one part at a time
    left its other parts on the other side (val measured text trained on): it moves whole,
    held in memory or, past `MEMORY_TOKENS` (a 20 GB dump's parts), on disk."""
    monkeypatch.setattr("kiln.data.held_text.MEMORY_TOKENS", memory_tokens)
    lowest = min(split_hash(0, d.id) for d in DOCS[:10])
    low = next(n for n in (f"dump{i}" for i in range(1000)) if split_hash(0, n) < lowest)
    parts = _cut_text(low, 3)
    docs = DOCS[:5] + parts + DOCS[5:10]
    fraction = split_hash(0, low) / 2  # no text below it: val is empty
    index = write_shards(docs, tok, tmp_path / "to_val", val_fraction=fraction, progress=False)
    enc = {d.id: (*tok.encode(d.text).ids, 0) for d in docs}
    val = _split_docs(_tokens(tmp_path / "to_val", index, "val"), 0)
    assert val == [enc[p.id] for p in parts]
    assert (index["train"]["documents"], index["val"]["documents"]) == (10, 3)
    assert not list((tmp_path / "to_val").glob(".held*"))

    last = DOCS[:3] + _cut_text("tail", 3)  # every text in val: the cut one, last, moves
    index = write_shards(last, tok, tmp_path / "to_train", val_fraction=0.999999,
                         progress=False)
    enc = {d.id: (*tok.encode(d.text).ids, 0) for d in last}
    assert _split_docs(_tokens(tmp_path / "to_train", index, "train"), 0) == [
        enc[d.id] for d in last[3:]]
    assert _split_docs(_tokens(tmp_path / "to_train", index, "val"), 0) == [
        enc[d.id] for d in last[:3]]


@pytest.mark.parametrize("fraction", [1e-12, 0.999999])
def test_a_corpus_of_one_cut_text_still_gets_both_splits(tok, tmp_path, fraction):
    """One text in all (a single large file, cut by the reader) cannot move whole: its first
    part is held out (or its last part trained on), as before, rather than an empty split."""
    parts = _cut_text("only", 4)
    index = write_shards(parts, tok, tmp_path, val_fraction=fraction, progress=False)
    enc = [(*tok.encode(p.text).ids, 0) for p in parts]
    train = _split_docs(_tokens(tmp_path, index, "train"), 0)
    val = _split_docs(_tokens(tmp_path, index, "val"), 0)
    assert (val, train) == ((enc[:1], enc[1:]) if fraction < 0.5 else (enc[:3], enc[3:]))


@pytest.mark.parametrize("fraction", [1e-12, 0.999999])
def test_benchmark_replicas_do_not_make_a_one_text_corpus_two_texts(tok, tmp_path, fraction):
    """Replicas go to train whatever their hash, but they are no text of the corpus: counted
    as train's documents, a corpus of one cut text (a contamination study on one dump) went
    to val whole, leaving train the replicas alone. Its first part goes to val (its last
    to train), as without replicas."""
    parts = _cut_text("only", 4)
    replicas = [Document(text=f"Problem: add {i} and 2\n\nSolution: {i + 2}", id=f"rep-{i}",
                         metadata={"injected_item": i}) for i in range(2)]
    docs = replicas[:1] + parts + replicas[1:]
    index = write_shards(docs, tok, tmp_path, val_fraction=fraction, progress=False)
    enc = {d.id: (*tok.encode(d.text).ids, 0) for d in docs}
    val = _split_docs(_tokens(tmp_path, index, "val"), 0)
    train = _split_docs(_tokens(tmp_path, index, "train"), 0)
    held_out = parts[:1] if fraction < 0.5 else parts[:3]
    assert val == [enc[p.id] for p in held_out]
    assert sorted(train) == sorted(enc[d.id] for d in docs if d not in held_out)


def test_long_documents_are_encoded_a_bounded_number_of_characters_at_a_time(
        tok, tmp_path, monkeypatch):
    """An HF Encoding holds ~225 bytes a token: 256 documents of a million characters (cut
    books) encoded at once took ~20 GB. A batch stops at BATCH_CHARS characters (a document
    longer than that alone), and the shards are the same."""
    from kiln.data import shards

    docs = [Document(text=f"def f{i}(x):\n" + "    return x\n" * (i % 9 * 40), id=f"long{i}")
            for i in range(60)]
    whole = write_shards(docs, tok, tmp_path / "whole", val_fraction=0.2, progress=False)
    batches = []

    class Recording:
        def __getattr__(self, name):
            return getattr(tok, name)

        def encode_batch(self, texts, **kwargs):
            batches.append([len(t) for t in texts])
            return tok.encode_batch(texts, **kwargs)

    monkeypatch.setattr(shards, "BATCH_CHARS", 2000, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 1)  # a batch's least documents: one a core
    capped = write_shards(docs, Recording(), tmp_path / "capped", val_fraction=0.2,
                          progress=False)
    assert len(batches) > 5 and sum(map(len, batches)) == len(docs)
    assert all(sum(b) - b[-1] < 2000 for b in batches)  # over it only with its last
    assert capped == whole
    for split in ("train", "val"):
        assert (_tokens(tmp_path / "capped", capped, split)
                == _tokens(tmp_path / "whole", whole, split)).all()


def test_a_batch_of_long_documents_still_gives_every_core_one(monkeypatch):
    """encode_batch encodes each document on one core: stopped at BATCH_CHARS, a batch of
    cut books' million-character parts held 4, and 12 of 16 cores sat idle while the bound
    was kept. A batch takes at least a document a core, at most `size`."""
    from kiln.data.shards import _batches

    part = "x" * 1_000_000
    docs = [Document(text=part, id=f"book#{k}") for k in range(1, 41)]
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [len(b) for b in _batches(docs, 256)] == [16, 16, 8]
    assert [len(b) for b in _batches(docs, 10)] == [10, 10, 10, 10]
    short = [Document(text="y" * 100, id=f"s{k}") for k in range(40)]
    assert [len(b) for b in _batches(short, 32)] == [32, 8]


def test_injected_replicas_all_go_to_train(tok, tmp_path):
    """The contamination study trains on all k replicas of each item; a replica that landed in
    val would be missing from training and would put benchmark text in the held-out loss.
    Replicas (metadata `injected_item`) go to train whatever their hash; the other documents
    split exactly as before."""
    replicas = [Document(text=f"Problem: add {i} and {j}\n\nSolution: {i + j}",
                         id=f"replica-{i}-{j}", metadata={"injected_item": i})  # as InjectReplicas sets
                for i in range(10) for j in range(5)]
    docs = [d for pair in zip(DOCS[:50], replicas) for d in pair] + DOCS[50:]
    index = write_shards(docs, tok, tmp_path, val_fraction=0.2, seed=3, progress=False)
    hashed_to_val = [r for r in replicas if split_hash(3, r.id) < 0.2]
    assert len(hashed_to_val) >= 5  # without the rule these would have been val documents
    enc = {d.id: (*tok.encode(d.text).ids, 0) for d in docs}
    want_val = [enc[d.id] for d in DOCS if split_hash(3, d.id) < 0.2]
    assert _split_docs(_tokens(tmp_path, index, "val"), 0) == want_val
    train = _split_docs(_tokens(tmp_path, index, "train"), 0)
    assert sorted(train) == sorted([enc[r.id] for r in replicas]
                                   + [enc[d.id] for d in DOCS if split_hash(3, d.id) >= 0.2])
    assert (index["train"]["documents"], index["val"]["documents"]) == (
        len(docs) - len(want_val), len(want_val))


def test_a_tokenizer_that_drops_text_stops_tokenize_in_one_line_keeping_the_shards(tok, tmp_path):
    """A pre-tokenizer that drops a character the load-time probe does not hold ("~"):
    the first document holding it stopped tokenize with a RuntimeError (a traceback); it is
    a RunDataError (one line) naming the document, and the shards made before stay."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    from kiln.errors import RunDataError

    write_shards(DOCS[:20], tok, tmp_path, val_fraction=0.1, progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    odd = Tokenizer.from_str(tok.to_str())
    odd.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex("~"), behavior="removed"), odd.pre_tokenizer])
    docs = [*DOCS[:5], Document(text="x = ~y\n", id="tilde")]
    with pytest.raises(RunDataError, match=r"document tilde: its tokens stand for 6 bytes, its "
                                           r"text for 7.*re-run `kiln tokenizer`"):
        write_shards(docs, odd, tmp_path, val_fraction=0.1, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
