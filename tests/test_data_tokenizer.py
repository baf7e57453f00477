"""Byte-level BPE: exact round trip on any string, EOS at id 0, vocab size respected."""

import pytest

from kiln.data.tokenizer import EOS_TOKEN, eos_id, load_tokenizer, train_tokenizer

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i, i * i)\n",
] * 20

NASTY = [
    "",
    " ",
    "hello world",
    "trailing spaces   ",
    "\ttabs\tand\r\nCRLF\r\n",
    "null\x00byte",
    "emoji 😀👍🏽 and ZWJ 👨‍👩‍👧",
    "CJK 中文字符 日本語 한국어",
    "combining é vs é",
    "literal <|endoftext|> inside",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "\U0010ffff private plane",
    "  leading\n\n\nnewlines\n",
]


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(CORPUS, vocab_size=300, out_path=path, show_progress=False)
    return path


@pytest.mark.parametrize("text", NASTY)
def test_round_trip_exact(tok_path, text):
    tok = load_tokenizer(tok_path)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_literal_eos_string_is_not_eos(tok_path):
    tok = load_tokenizer(tok_path)
    for enc in [tok.encode("a<|endoftext|>b")] + tok.encode_batch(["a<|endoftext|>b"]):
        assert eos_id(tok) not in enc.ids
        assert len(enc.ids) > 3


def test_eos_id_and_decode(tok_path):
    tok = load_tokenizer(tok_path)
    assert eos_id(tok) == 0
    assert tok.id_to_token(0) == EOS_TOKEN
    ids = tok.encode("x = 1", add_special_tokens=False).ids
    assert tok.decode([*ids, 0], skip_special_tokens=False) == "x = 1" + EOS_TOKEN


def test_vocab_size_and_merges_learned(tok_path):
    tok = load_tokenizer(tok_path)
    assert tok.get_vocab_size() == 300
    # learned merges compress the training text well below one token per byte
    text = CORPUS[1]
    assert len(tok.encode(text).ids) < len(text.encode()) / 2


def test_returned_tokenizer_matches_loaded(tmp_path):
    tok = train_tokenizer(CORPUS, vocab_size=280, out_path=tmp_path / "t.json", show_progress=False)
    loaded = load_tokenizer(tmp_path / "t.json")
    assert tok.get_vocab_size() == loaded.get_vocab_size() == 280
    for text in NASTY:
        assert tok.encode(text).ids == loaded.encode(text).ids
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temp file left


def test_vocab_too_small(tmp_path):
    with pytest.raises(ValueError, match="257"):
        train_tokenizer(CORPUS, vocab_size=100, out_path=tmp_path / "t.json")


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="corrupt"):
        load_tokenizer(bad)


def test_training_cuts_pieces_at_max_piece_bytes_and_encoding_is_plain_byte_level(tmp_path):
    """A line with no whitespace (DNA, base64, minified code) is cut into pieces of at most
    MAX_PIECE_BYTES while BPE trains (its trainer slows down superlinearly in a piece's
    length), so no merge grows past it; the saved tokenizer pre-tokenizes exactly as plain
    byte-level does."""
    from tokenizers import pre_tokenizers

    from kiln.data.tokenizer import MAX_PIECE_BYTES

    # uncut, 5,000 x's would merge by doubling up to a 4,096-byte token
    tok = train_tokenizer(["x" * 5000] * 3, 300, tmp_path / "t.json", show_progress=False)
    longest = max(len(t) for t in tok.get_vocab())
    assert 128 < longest <= MAX_PIECE_BYTES
    text = "ACGT" * 300 + "def f(x):\n    return x  +  1  # naïve 東京 🚀\n\n\tdone"
    plain = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)
    assert load_tokenizer(tmp_path / "t.json").pre_tokenizer.pre_tokenize_str(text) == plain
    assert tok.decode(tok.encode(text).ids) == text


def test_a_tokenizer_that_is_not_byte_level_is_refused_in_one_line(tok_path, tmp_path, capsys):
    """A tokenizer.json brought from elsewhere: a WordPiece (its ids' bytes are unknown)
    stopped `kiln tokenize` with a traceback; one with a normaliser (NFKC turns "ﬁ" into
    "fi") would store ids whose bytes are not the text's."""
    from tokenizers import Tokenizer, models, normalizers

    from kiln.errors import RunDataError

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, EOS_TOKEN: 1, "a": 2}, unk_token="[UNK]"))
    wordpiece.save(str(tmp_path / "wp.json"))
    with pytest.raises(RunDataError, match=r"wp.json is not byte-level .*re-run it"):
        load_tokenizer(tmp_path / "wp.json")
    normalised = Tokenizer.from_file(str(tok_path))
    normalised.normalizer = normalizers.NFKC()
    normalised.save(str(tmp_path / "nfkc.json"))
    with pytest.raises(RunDataError, match="nfkc.json has a normalizer"):
        load_tokenizer(tmp_path / "nfkc.json")

    assert "is not byte-level" in _tokenize_refused(wordpiece, tmp_path, capsys)


def test_a_tokenizer_with_ids_past_its_vocabulary_size_is_refused_in_one_line(tok_path, tmp_path):
    """A tokenizer.json edited by hand can leave a gap in its ids: the vocabulary size (which
    sizes the shards' dtype, the embedding and the per-id tables) is then below an id it
    produces; loading it stopped with an IndexError traceback."""
    import json
    import re

    from kiln.errors import RunDataError

    spec = json.loads(tok_path.read_text())
    vocab = spec["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] = 70_000
    (tmp_path / "gap.json").write_text(json.dumps(spec))
    with pytest.raises(RunDataError, match=rf"gap.json has token {re.escape(repr(last))} at id 70000, past its "
                       r"vocabulary size 300.*re-run `kiln tokenizer`"):
        load_tokenizer(tmp_path / "gap.json")


def _tokenize_refused(tok, tmp_path, capsys) -> str:
    """`kiln tokenize` of a run holding `tok` as its tokenizer: exit status 1, its stderr."""
    from kiln.cli import main

    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "config.toml").write_text("")
    tok.save(str(run / "tokenizer" / "tokenizer.json"))
    assert main(["tokenize", str(run)]) == 1
    return capsys.readouterr().err


@pytest.mark.parametrize("pre", ["prefix_space", "none", "whitespace"])
def test_a_pre_tokenizer_that_changes_the_text_is_refused_in_one_line(tok_path, tmp_path, capsys,
                                                                      pre):
    """A byte-level BPE whose pre-tokenizer adds a prefix space ("hello" encodes as
    "Ġhello": 6 bytes), splits on whitespace and drops it, or is missing (a space, a byte
    outside printable ASCII, is then no token and is dropped) was loaded as byte-level, and
    `kiln tokenize` stopped at its first document with a RuntimeError traceback."""
    from tokenizers import Tokenizer, pre_tokenizers

    from kiln.errors import RunDataError

    tok = Tokenizer.from_file(str(tok_path))
    tok.pre_tokenizer = {"prefix_space": pre_tokenizers.ByteLevel(add_prefix_space=True),
                         "none": None, "whitespace": pre_tokenizers.Whitespace()}[pre]
    tok.save(str(tmp_path / "odd.json"))
    with pytest.raises(RunDataError, match=r"odd.json does not encode text byte for byte"):
        load_tokenizer(tmp_path / "odd.json")

    err = _tokenize_refused(tok, tmp_path, capsys)
    assert "does not encode text byte for byte" in err and "Traceback" not in err


def test_padding_and_truncation_in_the_file_are_off_so_the_shards_hold_every_document_whole(
        tok_path, tmp_path):
    """An HF tokenizer.json saved with padding (pad token EOS, as GPT-2-style tokenizers set
    it) padded each document of tokenize's `encode_batch` to the batch's longest with EOS:
    here the shards held 10,121 tokens for the 29 documents' 5,249, past the byte check (EOS
    stands for 0 bytes). Truncation cut every document at max_length
    (a RuntimeError mid-tokenize). Loaded, both are off: the shards are those of the plain
    tokenizer."""
    import numpy as np
    from datatrove.data import Document
    from tokenizers import Tokenizer

    from kiln.data.loader import TokenStream
    from kiln.data.shards import write_shards

    docs = [Document(text="def f(x):\n    return x\n" * k, id=f"d{k}") for k in range(1, 30)]
    plain = load_tokenizer(tok_path)
    expected = np.concatenate([[*plain.encode(d.text, add_special_tokens=False).ids, 0]
                               for d in docs])
    for name, setting in [("padded", lambda t: t.enable_padding(pad_id=0, pad_token=EOS_TOKEN)),
                          ("cut", lambda t: t.enable_truncation(max_length=8))]:
        odd = Tokenizer.from_file(str(tok_path))
        setting(odd)
        odd.save(str(tmp_path / f"{name}.json"))
        tok = load_tokenizer(tmp_path / f"{name}.json")
        write_shards(docs, tok, tmp_path / name, val_fraction=0.0, progress=False)
        stream = TokenStream(tmp_path / name, "train")
        assert np.array_equal(stream.read(0, stream.n_tokens), expected), name
        assert tok.padding is None and tok.truncation is None


def test_an_eos_that_is_not_a_special_token_is_refused_in_one_line(tok_path, tmp_path):
    """A tokenizer.json whose EOS is an ordinary added token (`"special": false`) loaded:
    raw text's literal "<|endoftext|>" then encoded as the EOS id ("a<|endoftext|>b" ->
    [65, 0, 66]: a document boundary inside a document), and EOS counted as 13 bytes, so
    tokenize stopped at its first document (its tokens stood for 18 bytes, "hello" for 5)."""
    import json

    from kiln.errors import RunDataError

    spec = json.loads(tok_path.read_text())
    for token in spec["added_tokens"]:
        if token["content"] == EOS_TOKEN:
            token["special"] = False
    (tmp_path / "plain_eos.json").write_text(json.dumps(spec))
    with pytest.raises(RunDataError, match=r"plain_eos.json has '<\|endoftext\|>' as an "
                                           r"ordinary token, not a special one"):
        load_tokenizer(tmp_path / "plain_eos.json")
