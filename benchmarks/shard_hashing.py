"""What hashing each token shard costs: writing ~100 MB of shards (kiln tokenize's writer,
pre-tokenized ids, so tokenization itself is left out) hashed as written vs plain files;
opening them (train start, each resume, each validation) with the stat check vs without;
and the one-time re-hash of a copy whose stat changed.

    python benchmarks/shard_hashing.py [--tokens 52428800] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import median

import kiln.data.loader as loader
import kiln.data.shard_hashes as shard_hashes
import kiln.data.shards as shards
from kiln.atomic import write_json_atomic
from kiln.data.loader import TokenStream

VOCAB = 50_000


class PlainWriter:
    """The writer before shards were hashed: a plain file, no digest."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close)

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    def close(self) -> None:
        self._file.close()

    def hexdigest(self) -> str:
        return "0" * 64


def write(out: Path, docs: list[np.ndarray], hashed: bool) -> float:
    """Seconds to write `docs` through kiln tokenize's shard writer, and its index."""
    shards.HashingWriter = shards_writer if hashed else PlainWriter
    try:
        out.mkdir()
        start = time.perf_counter()
        writer = shards._ShardWriter(out, "train", shards.token_dtype(VOCAB), 2**24, VOCAB)
        for ids in docs:
            writer.add(ids, len(ids) * 4)
        writer.close()
        if hashed:
            shard_hashes.record_checked(out, {s["file"]: s["sha256"] for s in writer.shards})
        index = {"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 0,
                 "train": writer.summary(), "val": {"shards": [], "documents": 0, "tokens": 0,
                                                   "bytes": 0}}
        write_json_atomic(out / "index.json", index)
        return time.perf_counter() - start
    finally:  # kiln's own writer again for whatever runs next in this process
        shards.HashingWriter = shards_writer


def open_time(out: Path, check: bool, repeats: int = 20) -> float:
    loader.check_shard_hashes = real_check if check else (lambda *a: [])
    try:
        TokenStream(out, "train")  # warm-up: the index and the shards' inodes in cache
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            TokenStream(out, "train")
            times.append(time.perf_counter() - start)
        return median(times)
    finally:
        loader.check_shard_hashes = real_check


shards_writer, real_check = shards.HashingWriter, loader.check_shard_hashes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=50 * 2**20)  # 100 MiB of uint16
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 2000, size=args.tokens // 1100 + 1)
    ids = rng.integers(1, VOCAB, size=int(lengths.sum()), dtype=np.int64)
    docs = np.split(ids, np.cumsum(lengths)[:-1])
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        writes = {"plain": [], "hashed": []}
        for r in range(3):  # alternating, so the page cache and disk treat both alike
            for kind in (("plain", "hashed") if r % 2 == 0 else ("hashed", "plain")):
                out = root / f"{kind}{r}"
                writes[kind].append(write(out, docs, kind == "hashed"))
                if r < 2:
                    shutil.rmtree(out)
        plain_s, hashed_s = median(writes["plain"]), median(writes["hashed"])
        out = root / "hashed2"
        mb = sum(p.stat().st_size for p in out.glob("*.bin")) / 1e6
        n_shards = len(list(out.glob("*.bin")))
        open_plain, open_checked = open_time(out, False), open_time(out, True)
        copy = root / "copy"
        shutil.copytree(out, copy)  # other inodes and ctimes: each shard hashed once
        start = time.perf_counter()
        rehashed = real_check(copy, shards.load_index(copy)["train"]["shards"])
        rehash_s = time.perf_counter() - start
        assert len(rehashed) == n_shards
    print(f"{mb:.1f} MB in {n_shards} shards")
    print(f"write: plain {plain_s:.3f} s, hashed as written {hashed_s:.3f} s "
          f"(+{hashed_s - plain_s:.3f} s)")
    print(f"open: unchecked {open_plain * 1e3:.3f} ms, stat-checked {open_checked * 1e3:.3f} ms")
    print(f"a copy's one-time re-hash: {rehash_s:.3f} s ({mb / rehash_s:.0f} MB/s)")
    print(f"RESULT shard_mb={mb:.1f} write_hashed_over_plain={hashed_s / plain_s:.3f} "
          f"write_extra_s={hashed_s - plain_s:.3f} open_checked_ms={open_checked * 1e3:.3f} "
          f"open_unchecked_ms={open_plain * 1e3:.3f} rehash_s={rehash_s:.3f}")


if __name__ == "__main__":
    main()
