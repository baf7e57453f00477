"""Byte-level BPE (HF `tokenizers`) whose round trip is exact for any string.

Every byte is in the base alphabet, so nothing is ever unknown. The EOS token is a registered
special token (HF tools and `skip_special_tokens` recognise it), but `encode_special_tokens`
is switched on so that raw text containing the literal "<|endoftext|>" is encoded as ordinary
bytes: only the data pipeline inserts EOS, by id. That flag is not saved in tokenizer.json,
so always load through `load_tokenizer`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.atomic import atomic_path
from kiln.config import MIN_VOCAB
from kiln.errors import RunDataError
from kiln.interrupts import taking_signals

EOS_TOKEN = "<|endoftext|>"
# The BPE trainer slows down faster than linearly with a piece's length (one 400 KB line of
# DNA took 35 s, 800 KB over 3 min; in 80-column lines, 0.2 s): while training, pieces are
# cut to this many bytes, far longer than any merge a corpus makes. The saved tokenizer
# encodes without the cut (it would cost ~40% of encoding time; encoding long pieces is fast).
MAX_PIECE_BYTES = 256


def capped_pieces(pre_tokenizer: pre_tokenizers.PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """`pre_tokenizer` (ending in byte symbols) followed by a cut of every piece into runs of
    at most MAX_PIECE_BYTES symbols (one symbol per byte; no newline is left to stop `.`):
    the pre-tokenizer BPE training sees."""
    cut = pre_tokenizers.Split(Regex(f".{{1,{MAX_PIECE_BYTES}}}"), behavior="isolated")
    return pre_tokenizers.Sequence([pre_tokenizer, cut])


def _protect_specials(tok: Tokenizer) -> Tokenizer:
    tok.encode_special_tokens = True
    return tok


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    pre_tokenizer: pre_tokenizers.PreTokenizer,
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = True,
) -> Tokenizer:
    """A byte-level BPE trained in memory: EOS at id 0, every byte in the alphabet (so any
    input round-trips), ByteLevel decoding; `pre_tokenizer` decides where merges may not cross."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB} (256 bytes + EOS), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = capped_pieces(pre_tokenizer)  # for training only (see MAX_PIECE_BYTES)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],  # first special token -> id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    if length is None and hasattr(texts, "__len__"):
        length = len(texts)  # type: ignore[arg-type]
    # in a thread of its own: a stop signal comes at once, not when training returns
    taking_signals(lambda: tok.train_from_iterator(texts, trainer=trainer, length=length))
    tok.pre_tokenizer = pre_tokenizer
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_path: Path | str,
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = True,
) -> Tokenizer:
    """Train a byte-level BPE on `texts`, save it atomically to `out_path`, and return it.

    `length` is the number of texts (a progress hint); taken from `len(texts)` when it has one.
    The vocabulary may come out smaller than `vocab_size` when the corpus has too few merges.
    """
    tok = train_bpe(texts, vocab_size, pre_tokenizers.ByteLevel(add_prefix_space=False),
                    min_frequency, length, show_progress)
    with atomic_path(out_path) as tmp:
        tok.save(str(tmp))
    return _protect_specials(tok)


def load_tokenizer(path: Path | str) -> Tokenizer:
    """Load a tokenizer saved by `train_tokenizer`, with specials in raw text left unparsed,
    and with no padding or truncation: a tokenizer.json brought from elsewhere may set them
    (an HF tokenizer saved with a pad token, often EOS), and `encode_batch` then padded
    each document of a batch to the longest with pad ids, written into the shards as
    tokens (0 bytes each, past the byte check), or cut every document at max_length."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer not found at {path}; train one first (`kiln tokenizer`)"
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise RunDataError(f"tokenizer file {path} is corrupt or not a tokenizer ({e}); "
                           "re-run `kiln tokenizer`") from e
    tok.no_padding()
    tok.no_truncation()
    if tok.token_to_id(EOS_TOKEN) is None:
        raise RunDataError(f"tokenizer {path} has no {EOS_TOKEN!r} token; re-run `kiln tokenizer`")
    if problem := _ids_past_vocab(tok):
        raise RunDataError(f"tokenizer {path} {problem}: the shards' dtype, the model's embedding "
                           "and every per-id table are sized by it; re-run `kiln tokenizer`")
    if problem := _not_byte_level(tok):
        raise RunDataError(f"tokenizer {path} {problem}: Kiln needs the byte-level BPE "
                           "`kiln tokenizer` trains; re-run it")
    eos = tok.get_added_tokens_decoder().get(tok.token_to_id(EOS_TOKEN))
    if eos is None or not eos.special:
        # an ordinary token: raw text's literal "<|endoftext|>" would encode as the EOS id
        # (encode_special_tokens spares only specials), and its 13 bytes be counted per EOS
        raise RunDataError(f"tokenizer {path} has {EOS_TOKEN!r} as an ordinary token, not a "
                           "special one: the text's own would end documents; re-run "
                           "`kiln tokenizer`")
    return _protect_specials(tok)


def _ids_past_vocab(tok: Tokenizer) -> str:
    """Why not every id is below the vocabulary size ("" when all are): a tokenizer.json
    edited by hand, or from elsewhere, can leave gaps in its ids."""
    size = tok.get_vocab_size()
    token, idx = max(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    return f"has token {token!r} at id {idx}, past its vocabulary size {size}" if idx >= size else ""


def _not_byte_level(tok: Tokenizer) -> str:
    """Why `tok` is not a byte-level BPE that leaves the text as it is ("" when it is): the
    shards, bits per byte and the stale-tokenizer check count the bytes of each id, so a
    tokenizer.json brought from elsewhere (a WordPiece, a normaliser) would count wrong. A
    pre-tokenizer is judged by what it does (`_PROBE`): one that adds a prefix space, drops
    whitespace, or is missing stopped `kiln tokenize` with a traceback at its first document."""
    spec = json.loads(tok.to_str())
    model, decoder = (spec.get("model") or {}).get("type"), (spec.get("decoder") or {}).get("type")
    if model != "BPE" or decoder != "ByteLevel":
        return f"is not byte-level (a {model} model, {decoder} decoder)"
    if tok.normalizer is not None:
        return "has a normalizer, which changes the text"
    try:
        lengths = token_byte_lengths(tok)
    except ValueError as e:
        return f"is not byte-level ({e})"
    ids = tok.encode(_PROBE, add_special_tokens=False).ids
    if (int(lengths[ids].sum()) != len(_PROBE.encode("utf-8"))
            or tok.decode(ids, skip_special_tokens=False) != _PROBE):
        shown = tok.pre_tokenizer.__class__.__name__ if tok.pre_tokenizer else "no"
        return (f"does not encode text byte for byte (its ids for a test text stand for other "
                f"bytes; {shown} pre-tokenizer)")
    return ""


# text a byte-level BPE's ids must stand for byte for byte (the vocabulary alone cannot
# tell: a pre-tokenizer that adds a prefix space, drops whitespace, or is missing, so that
# bytes outside printable ASCII are dropped, changes the text its ids stand for)
_PROBE = "a  b\n\r\n\tc\x00 é 東京 😀\u200d!"


def eos_id(tok: Tokenizer) -> int:
    """The id the data pipeline appends after every document."""
    idx = tok.token_to_id(EOS_TOKEN)
    if idx is None:
        raise ValueError(f"tokenizer has no {EOS_TOKEN!r} token")
    return idx


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """The UTF-8 bytes each id stands for (0 for special tokens such as EOS), indexed by id.

    Byte-level BPE writes each byte as one symbol, so a token's length in symbols is its
    length in bytes: bits per byte can divide by the exact bytes of the tokens it scored.
    """
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    added = tok.get_added_tokens_decoder()
    lengths = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for idx, token in added.items():  # added tokens match literal text; specials stand for none
        lengths[idx] = 0 if token.special else len(token.content.encode("utf-8"))
    for token, idx in tok.get_vocab(with_added_tokens=False).items():
        if idx in added:
            continue
        if not set(token) <= alphabet:
            raise ValueError(f"token {idx} ({token!r}) is not byte-level: its bytes are unknown")
        lengths[idx] = len(token)
    return lengths
