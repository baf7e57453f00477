"""Deterministic, rank-sharded batches of token windows whose position fits in a checkpoint.

The split is one token stream cut into windows of seq_len + 1 tokens at stride seq_len (each
token is a target exactly once). Global step s takes G consecutive entries of a per-epoch
permutation; rank r takes the r-th contiguous slice of them. So the batches depend only on
(seed, step), never on the world size or on how the trainer splits them into micro-batches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from kiln.data.open_files import room_for_open_files
from kiln.data.shard_hashes import HASH_KEY, check_shard_hashes
from kiln.data.shards import INDEX, SPLITS, load_index
from kiln.errors import ConfigError, RunDataError


def shards_fingerprint(index: dict, contents: bool = True) -> str:
    """The index's token and byte counts, unigram entropy and each shard's sha256, per split,
    hashed: re-made data (other documents, or the same in another order, even with the same
    counts) gives another fingerprint. What the shards were made from is left out (indexes
    from before it was recorded match), and so is the name of the unigram counts file (a
    later Kiln's addition, from the same shards). `contents=False` leaves the shards' hashes
    out too: the fingerprint checkpoints recorded before Kiln hashed them (`counts_only`)."""
    content = {k: v for k, v in index.items() if k not in ("made_from", "unigram_counts")}
    if not contents:
        for split in SPLITS:
            if isinstance(content.get(split), dict) and "shards" in content[split]:
                content[split] = {**content[split], "shards": [
                    {k: v for k, v in shard.items() if k != HASH_KEY}
                    for shard in content[split]["shards"]]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def counts_only(index: dict) -> bool:
    """An index from before Kiln hashed each shard's contents: only sizes can be checked."""
    return any(HASH_KEY not in shard for split in SPLITS if split in index
               for shard in index[split]["shards"])


def accepts_fingerprint(index: dict, saved: str) -> bool:
    """`saved` (a checkpoint's) names these shards: their fingerprint, or, for a checkpoint
    saved before Kiln hashed the shards' contents, their counts (all it could record)."""
    return saved in (shards_fingerprint(index), shards_fingerprint(index, contents=False))


class TokenStream:
    """The shards of one split, read as a single concatenated array: memory-mapped while
    the open-file limit allows one descriptor per shard, else read window by window."""

    def __init__(self, shard_dir: Path | str, split: str):
        index = load_index(shard_dir)
        if split not in SPLITS or split not in index:
            raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
        dtype = _check_index(index, split, Path(shard_dir) / INDEX)
        self.split, self.vocab_size, self.dtype = split, int(index["vocab_size"]), dtype
        self.paths, starts = [], [0]
        for shard in index[split]["shards"]:
            if shard["tokens"] == 0:
                continue
            path = Path(shard_dir) / shard["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != shard["tokens"] * dtype.itemsize:
                held = ("is missing" if size is None else
                        f"holds {size // dtype.itemsize} tokens" if size % dtype.itemsize == 0
                        else f"holds {size} bytes (not a whole number of {dtype.name} tokens)")
                raise RunDataError(f"{path} {held}, where {INDEX} says {shard['tokens']} tokens: "
                                   "the shards are damaged; re-run `kiln tokenize`")
            self.paths.append(path)
            starts.append(starts[-1] + shard["tokens"])
        check_shard_hashes(Path(shard_dir), index[split]["shards"])
        self.starts = np.asarray(starts, dtype=np.int64)
        self.maps = ([np.memmap(p, dtype=dtype, mode="r") for p in self.paths]
                     if room_for_open_files(len(self.paths)) else None)
        self.n_tokens = int(self.starts[-1])
        self.index = index
        self.fingerprint = shards_fingerprint(index)

    def read(self, start: int, stop: int) -> np.ndarray:
        """tokens[start:stop] as int64, crossing shard boundaries where needed. An id outside
        the vocabulary (a shard overwritten or damaged inside) is refused here, where its
        file is known, rather than as an index error inside the embedding (a device-side
        assert on a GPU); checking the few windows a batch reads costs nothing."""
        parts = []
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.starts[shard + 1]))
            base = int(self.starts[shard])
            part = self._part(shard, start - base, end - base)
            if part.size and int(part.max()) >= self.vocab_size:
                at = start - base + int(np.argmax(part >= self.vocab_size))
                raise RunDataError(
                    f"{self.paths[shard]} holds token id {int(part.max())} at token {at}, outside "
                    f"the vocabulary of {self.vocab_size}: the shards are damaged; re-run "
                    "`kiln tokenize`")
            parts.append(part)
            start, shard = end, shard + 1
        return np.concatenate(parts).astype(np.int64)

    def _part(self, shard: int, lo: int, hi: int) -> np.ndarray:
        if self.maps is not None:
            return self.maps[shard][lo:hi]
        return np.fromfile(self.paths[shard], dtype=self.dtype, count=hi - lo,
                           offset=lo * self.dtype.itemsize)


def _check_index(index: dict, split: str, path: Path) -> np.dtype:
    """The index `kiln tokenize` writes, consistent with itself (the shards are checked
    against it): each split's shards are `{split}_00000.bin`, ... in order and sum to its
    token count, the dtype holds every id of the vocabulary, EOS is one of them. An edited
    index would otherwise train on part of the data, or on other files, without a word."""
    try:
        vocab, table = int(index["vocab_size"]), index[split]
        dtype = np.dtype(index["dtype"]).newbyteorder("<")
        shards = table["shards"]
        problem = None
        if dtype.kind != "u" or vocab < 1 or np.iinfo(dtype).max < vocab - 1:
            problem = f"dtype {index['dtype']} cannot hold a vocabulary of {vocab}"
        elif not 0 <= int(index.get("eos_id", 0)) < vocab:
            problem = f"eos_id {index.get('eos_id')} is outside the vocabulary of {vocab}"
        elif [s["file"] for s in shards] != [f"{split}_{i:05d}.bin" for i in range(len(shards))]:
            problem = f"the {split} shards are not {split}_00000.bin, ... in order"
        elif (held := sum(int(s["tokens"]) for s in shards)) != int(table["tokens"]):
            problem = f"the {split} shards hold {held} tokens in all, not the {table['tokens']} it says"
    except (KeyError, TypeError, ValueError) as e:
        problem = f"{type(e).__name__}: {e}"
    if problem:
        raise RunDataError(f"{path} is not what `kiln tokenize` wrote ({problem}); re-run "
                           "`kiln tokenize`")
    return dtype


def _windows(stream: TokenStream, seq_len: int) -> int:
    n = (stream.n_tokens - 1) // seq_len
    if n < 1:
        raise ConfigError(f"the {stream.split} split has {stream.n_tokens} tokens, fewer than one "
                          f"window of train.seq_len + 1 = {seq_len + 1}: lower train.seq_len")
    return n


def _stack(stream: TokenStream, windows: np.ndarray, seq_len: int) -> torch.Tensor:
    rows = [stream.read(int(w) * seq_len, int(w) * seq_len + seq_len + 1) for w in windows]
    return torch.from_numpy(np.stack(rows))


class TokenLoader:
    """Shuffled training batches: `next_batch()` -> LongTensor (global_batch/world_size, seq_len+1)."""

    def __init__(
        self,
        shard_dir: Path | str,
        split: str,
        seq_len: int,
        global_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        if global_batch % world_size:
            raise ValueError(
                f"global_batch={global_batch} is not divisible by world_size={world_size}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} outside world_size={world_size}")
        self.stream = TokenStream(shard_dir, split)
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        self.rank, self.world_size = rank, world_size
        self.n_windows = _windows(self.stream, seq_len)
        self.position = 0  # windows consumed globally, over all ranks and epochs
        self._perm: tuple[int, np.ndarray] | None = None
        # resumed from a state that recorded the shards by their counts only (see load_state_dict)
        self.resumed_on_counts = False

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = (epoch, rng.permutation(self.n_windows))
        return self._perm[1]

    def _window_ids(self, positions: range) -> np.ndarray:
        return np.asarray(
            [self._permutation(p // self.n_windows)[p % self.n_windows] for p in positions]
        )

    def next_batch(self) -> torch.Tensor:
        """This rank's share of the next global step."""
        per_rank = self.global_batch // self.world_size
        first = self.position + self.rank * per_rank
        batch = _stack(self.stream, self._window_ids(range(first, first + per_rank)), self.seq_len)
        self.position += self.global_batch
        return batch

    def state_dict(self) -> dict:
        """Plain ints; `position` alone fixes what comes next (given seed and seq_len)."""
        return {
            "position": self.position,
            "step": self.position // self.global_batch,
            "epoch": self.position // self.n_windows,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "n_windows": self.n_windows,
            "data": self.stream.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` was taken (any world size or global batch)."""
        for key in ("seed", "seq_len", "n_windows"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"loader state has {key}={state[key]} but this loader has {getattr(self, key)};"
                    " resuming would change the data order"
                )
        saved = state.get("data", self.stream.fingerprint)  # older states: none
        if not accepts_fingerprint(self.stream.index, saved):
            raise ValueError("the loader state was saved on other token shards (tokens/"
                             "index.json differs): the data was re-made since")
        position = state["position"]
        if type(position) is not int or position < 0:  # int() would take -3, 2.5 and "7"
            raise TypeError(f"loader state position {position!r} is not a count of windows")
        self.resumed_on_counts = saved != self.stream.fingerprint
        self.position = position


def eval_batches(
    shard_dir: Path | str,
    split: str,
    seq_len: int,
    batch_size: int,
    max_batches: int,
    rank: int = 0,
    world_size: int = 1,
) -> EvalBatches:
    """Sequential windows, unshuffled, for losses that compare across runs.

    Batch b holds windows [b*batch_size, (b+1)*batch_size) (the last may be short) and goes to
    rank b % world_size; only the first `max_batches` batches are used (0 = all).
    """
    return EvalBatches(TokenStream(shard_dir, split), seq_len, batch_size, max_batches, rank,
                       world_size)


class EvalBatches:
    """This rank's evaluation batches, read from the memory-mapped shards one at a time as
    they are iterated; `len()` counts them without reading any (a whole split held as int64
    batches would take 4-8x the shards' size in memory)."""

    def __init__(self, stream: TokenStream, seq_len: int, batch_size: int, max_batches: int,
                 rank: int, world_size: int):
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.n_windows = _windows(stream, seq_len)
        n_batches = -(-self.n_windows // batch_size)
        if max_batches:
            n_batches = min(n_batches, max_batches)
        self.batch_ids = range(rank, n_batches, world_size)
        # windows the batches of every rank cover together: [0, scored_windows)
        self.scored_windows = min(self.n_windows, n_batches * batch_size)
        # a slot per window of the most batches any rank has, batch after batch: the same
        # length on every rank (`kiln.eval.window_losses.gather_window_losses`)
        self.rank_slots = -(-n_batches // world_size) * batch_size

    def __len__(self) -> int:
        return len(self.batch_ids)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for b in self.batch_ids:
            ids = np.arange(b * self.batch_size, min((b + 1) * self.batch_size, self.n_windows))
            yield _stack(self.stream, ids, self.seq_len)


def masking_eos_id(token_dir: Path, doc_mask: bool) -> int | None:
    """The EOS id that separates documents in `token_dir`'s shards when `model.doc_mask` is on
    (None when off: no document ids are made). Shards whose index records none are refused,
    naming the file: a guessed id would mask at the wrong tokens."""
    if not doc_mask:
        return None
    eos = load_index(token_dir).get("eos_id")
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise ConfigError(f"model.doc_mask = true needs the EOS id of the token shards, and "
                          f"{Path(token_dir) / INDEX} records none: re-run `kiln tokenize`, or "
                          "set model.doc_mask = false")
    return eos
