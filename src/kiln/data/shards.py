"""Documents -> flat token shards on disk (train/val split by document), plus index.json.

Shards are raw little-endian arrays so the loader can memory-map them with no parsing.
index.json is written last and atomically: a directory without it is incomplete.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from datatrove.data import Document
from tokenizers import Tokenizer
from tqdm import tqdm

from kiln import strict_json
from kiln.atomic import atomic_dir, write_json_atomic
from kiln.data.decontam.inject import INJECTED_KEY
from kiln.data.held_text import HeldText
from kiln.data.long_documents import PART_OF
from kiln.data.shard_hashes import HASH_KEY, record_checked
from kiln.data.tokenizer import eos_id, token_byte_lengths
from kiln.errors import RunDataError
from kiln.hashing import HashingWriter

SPLITS = ("train", "val")
INDEX = "index.json"
TOKEN_BYTES = "token_bytes.npy"  # the UTF-8 bytes each token id stands for (bits per byte)
UNIGRAM_COUNTS = "unigram_counts.npy"  # train count of each token id (the unigram baseline)
# characters encoded at once: an HF Encoding holds ~225 bytes a token (its token strings,
# offsets, masks), so a batch of 256 documents of a million characters (the parts of cut
# books) took ~20 GB; this many take a few hundred MB. A batch still holds a document for
# each core (`_batches`): encode_batch encodes each document on one core
BATCH_CHARS = 1 << 22
# the texts whose split is decided at the end (kiln.data.held_text), while tokenizing
HELD_TRAIN, HELD_VAL = ".held-train.bin", ".held-val.bin"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32; always little-endian."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def split_hash(seed: int, doc_id: str) -> float:
    """A stable uniform number in [0, 1) for (seed, id); unlike hash(), the same in every process."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class _ShardWriter:
    """Appends tokens to `{split}_{i:05d}.bin` files of at most `shard_tokens` tokens each,
    hashing each as it is written (its sha256 goes in the index: `kiln.data.shard_hashes`)."""

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int, vocab: int):
        self.out_dir, self.split, self.dtype, self.cap = out_dir, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self.counts = np.zeros(vocab, dtype=np.int64)
        self._pending: list[np.ndarray] = []  # ids not yet in `counts` (bincount in bulk: faster)
        self._pending_tokens = 0
        self.documents = self.tokens = self.bytes = 0
        self._file = None

    def add(self, ids: np.ndarray, n_bytes: int) -> None:
        self.documents += 1
        self.bytes += n_bytes
        self.tokens += len(ids)
        self._pending.append(ids)
        self._pending_tokens += len(ids)
        if self._pending_tokens >= 2**20:
            self._flush_counts()
        data = ids.astype(self.dtype)
        while len(data):
            if self._file is None or self.shards[-1]["tokens"] == self.cap:
                self._open_next()
            room = self.cap - self.shards[-1]["tokens"]
            self._file.write(data[:room].tobytes())
            self.shards[-1]["tokens"] += len(data[:room])
            data = data[room:]

    def _flush_counts(self) -> None:
        if self._pending:
            self.counts += np.bincount(np.concatenate(self._pending), minlength=len(self.counts))
        self._pending, self._pending_tokens = [], 0

    def _open_next(self) -> None:
        self.close()
        name = f"{self.split}_{len(self.shards):05d}.bin"
        self._file = HashingWriter(self.out_dir / name)  # closed in close()
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> None:
        self._flush_counts()
        if self._file is not None:
            self._file.close()
            self.shards[-1][HASH_KEY] = self._file.hexdigest()
            self._file = None

    def summary(self) -> dict:
        keys = ("shards", "documents", "tokens", "bytes")
        return {k: getattr(self, k) for k in keys}


def _batches(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    """`size` documents at a time, or fewer holding `BATCH_CHARS` characters in all, but
    never fewer than one for each core: encode_batch gives each document one core, so 4
    parts of a million characters kept 12 of 16 cores idle (a core's document is at most
    the reader's `MAX_DOCUMENT_CHARS`: 16 cores, 16M characters)."""
    least = min(size, os.cpu_count() or 1)
    batch: list[Document] = []
    chars = 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= size or (chars >= BATCH_CHARS and len(batch) >= least):
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def unigram_bits(train_counts: np.ndarray) -> np.ndarray:
    """Bits of each token id under the add-one-smoothed unigram model of train."""
    return -np.log2((train_counts + 1) / (train_counts.sum() + len(train_counts)))


def unigram_bpb(train_counts: np.ndarray, val_counts: np.ndarray, val_bytes: int) -> float | None:
    """Bits per byte of val under the add-one-smoothed unigram model of train: the floor to beat."""
    if val_bytes == 0:
        return None
    return float((val_counts * unigram_bits(train_counts)).sum() / val_bytes)


def write_shards(
    documents: Iterable[Document],
    tokenizer: Tokenizer,
    out_dir: Path | str,
    val_fraction: float = 0.01,
    seed: int = 0,
    shard_tokens: int = 2**24,
    batch_size: int = 256,
    progress: bool = True,
    made_from: dict | None = None,
    total: int | None = None,
) -> dict:
    """Tokenize documents (each followed by EOS) into train/val shards; return the index.
    `made_from` (what the documents and tokenizer were, see `kiln.data.provenance`) is
    recorded in the index; `total`, the documents expected, gives the bar an end and an ETA.

    A document goes to val when split_hash(seed, id) < val_fraction (the parts of a text the
    reader cut, by the text's id: `part_of`), but for a benchmark replica `inject_replicas`
    put in (`INJECTED_KEY`), which always goes to train: the contamination study trains on
    all k replicas, and a val split holding benchmark text would not measure held-out loss.
    If that leaves val empty
    (and val_fraction > 0, >= 2 docs), the train text with the smallest hash moves to val;
    it is held back for that reason and, if not needed, ends the train stream. If it leaves
    train empty (a large val_fraction, few documents), the last val text goes to train
    instead: each val text is written one text late for that reason. A text moves whole,
    all the parts of a cut one (`kiln.data.held_text`), but for the corpus's only text
    (replicas are none of its texts): then its first part goes to val, or its last to train.
    The shards are written into a temporary folder that replaces `out_dir` only when all is
    on disk: an interrupted re-tokenize leaves the shards a trained run was made from.
    """
    with atomic_dir(out_dir) as tmp:
        return _write_split(documents, tokenizer, tmp, val_fraction, seed, shard_tokens,
                            batch_size, progress, made_from, total)


def _write_split(documents: Iterable[Document], tokenizer: Tokenizer, out_dir: Path,
                 val_fraction: float, seed: int, shard_tokens: int, batch_size: int,
                 progress: bool, made_from: dict | None, total: int | None = None) -> dict:
    vocab = tokenizer.get_vocab_size()
    dtype, eos = token_dtype(vocab), eos_id(tokenizer)
    writers = {s: _ShardWriter(out_dir, s, dtype, shard_tokens, vocab) for s in SPLITS}
    byte_lengths = token_byte_lengths(tokenizer)
    # the train text with the smallest hash, held back, and the last val text, written one
    # text late (see above): in memory, or past `MEMORY_TOKENS` on disk beside the shards
    held: HeldText | None = None
    last_val: HeldText | None = None
    replicas = 0  # train's benchmark replicas: no text of the corpus, for the rules below

    bar = tqdm(desc="tokenize", unit="doc", total=total, disable=not progress)
    for batch in _batches(documents, batch_size):
        encodings = tokenizer.encode_batch([d.text for d in batch], add_special_tokens=False)
        for doc, enc in zip(batch, encodings, strict=True):
            ids = np.asarray([*enc.ids, eos], dtype=np.int64)
            n_bytes = len(doc.text.encode("utf-8"))
            if int(byte_lengths[ids].sum()) != n_bytes:  # byte-level BPE has no normaliser
                # a tokenizer.json brought in that `load_tokenizer`'s probe did not catch:
                # one line naming the document (the old shards stay), not a traceback
                raise RunDataError(f"document {doc.id}: its tokens stand for "
                                   f"{int(byte_lengths[ids].sum())} bytes, its text for "
                                   f"{n_bytes}: the tokenizer does not encode text byte for "
                                   "byte; re-run `kiln tokenizer`")
            h = split_hash(seed, doc.metadata.get(PART_OF) or doc.id)  # a cut text's parts: one side
            if INJECTED_KEY in doc.metadata:  # a benchmark replica: train only (see above)
                writers["train"].add(ids, n_bytes)
                replicas += 1
            elif h < val_fraction:
                if last_val is not None and last_val.hash != h:
                    last_val.write_to(writers["val"])
                    last_val = None
                last_val = last_val or HeldText(out_dir / HELD_VAL, h, dtype)
                last_val.add(ids, n_bytes)
            elif held is not None and h == held.hash:  # a later part of the held text
                held.add(ids, n_bytes)
            elif val_fraction > 0 and (held is None or h < held.hash):
                if held is not None:
                    held.write_to(writers["train"])
                held = HeldText(out_dir / HELD_TRAIN, h, dtype)
                held.add(ids, n_bytes)
            else:
                writers["train"].add(ids, n_bytes)
        bar.update(len(batch))
    bar.close()
    train, val = writers["train"], writers["val"]
    # train's documents of the corpus: replicas alone are no training text, and with them
    # counted a corpus of one cut text went to val whole, train left with the replicas
    trained = train.documents - replicas
    if last_val is not None:  # its place in val, unless train would otherwise be empty
        to_train = 0
        if trained == 0 and held is None:  # the corpus's only text: its last part
            to_train = len(last_val.docs) if val.documents else 1
        last_val.write_to(val, len(last_val.docs) - to_train, train)
        trained = train.documents - replicas
    if held is not None:  # its place in train, unless val would otherwise be empty
        to_val = 0
        if val_fraction > 0 and val.documents == 0:  # the corpus's only text: its first part
            to_val = len(held.docs) if trained else min(1, len(held.docs) - 1)
        held.write_to(val, to_val, train)
    for w in writers.values():
        w.close()

    index = {
        "dtype": dtype.name,
        "vocab_size": vocab,
        "eos_id": eos,
        "seed": seed,
        "val_fraction": val_fraction,
        **{s: w.summary() for s, w in writers.items()},  # index["train"], index["val"]
        "unigram_bpb": unigram_bpb(train.counts, val.counts, val.bytes),
    }
    with open(out_dir / TOKEN_BYTES, "wb") as f:
        np.save(f, byte_lengths.astype(np.uint16))
    index["token_bytes"] = TOKEN_BYTES
    with open(out_dir / UNIGRAM_COUNTS, "wb") as f:
        np.save(f, train.counts)
    index["unigram_counts"] = UNIGRAM_COUNTS
    if made_from is not None:
        index["made_from"] = made_from
    record_checked(out_dir, {s["file"]: s[HASH_KEY] for w in writers.values() for s in w.shards})
    write_json_atomic(out_dir / INDEX, index)
    return index


def load_index(out_dir: Path | str) -> dict:
    """The index written by `write_shards`; its absence means tokenization never finished."""
    path = Path(out_dir) / INDEX
    if not path.is_file():
        raise FileNotFoundError(
            f"no token shards at {out_dir} (missing {INDEX}); run `kiln tokenize` first"
        )
    try:
        index = strict_json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDataError(f"{path} is damaged ({e}); re-run `kiln tokenize`") from e
    if not isinstance(index, dict) or "vocab_size" not in index:
        raise RunDataError(f"{path} lacks vocab_size; re-run `kiln tokenize`")
    return index


def load_unigram_bits(out_dir: Path | str) -> np.ndarray | None:
    """Bits of each token id under the train split's unigram model (what the baseline scores),
    or None for shards written before Kiln saved the counts."""
    index = load_index(out_dir)
    if "unigram_counts" not in index:
        return None
    path = Path(out_dir) / index["unigram_counts"]
    try:
        counts = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RunDataError(f"{path} is missing or damaged ({e}); re-run `kiln tokenize`") from e
    if counts.shape != (index["vocab_size"],) or counts.dtype.kind not in "iu" or (counts < 0).any():
        raise RunDataError(f"{path} does not hold {index['vocab_size']} token counts; re-run "
                           "`kiln tokenize`")
    return unigram_bits(counts.astype(np.int64))


def load_token_bytes(out_dir: Path | str) -> np.ndarray | None:
    """The bytes each token id stands for, or None for shards written before Kiln saved it."""
    index = load_index(out_dir)
    if "token_bytes" not in index:
        return None
    path = Path(out_dir) / index["token_bytes"]
    try:
        lengths = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RunDataError(f"{path} is missing or damaged ({e}); re-run `kiln tokenize`") from e
    if lengths.shape != (index["vocab_size"],):
        raise RunDataError(f"{path} has {lengths.shape} entries for a vocabulary of "
                           f"{index['vocab_size']}; re-run `kiln tokenize`")
    return lengths.astype(np.int64)
