"""Each evaluated window's mean loss, kept beside eval.json so two runs scored on the same
held-out windows can be set against each other (`kiln report --compare`: Hedges' g,
`kiln.eval.effect_size`).

The file is float64 `.npy`, one value per window in the split's order, written atomically
before eval.json, which records its name, count and sha256: a file that does not match the
record (an eval killed between the two writes, or a file from another eval) is refused, not
read. eval.json also records `split_sha256`, a hash of the split's shard hashes from
tokens/index.json: the same value means the same tokens, so the windows pair up.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from kiln.atomic import atomic_path
from kiln.data.shard_hashes import HASH_KEY
from kiln.eval import windows_file
from kiln.hashing import file_sha256


def split_sha256(index: dict[str, Any], split: str) -> str | None:
    """A hash of `split`'s shards (names, token counts, sha256s) from index.json; None for
    shards from before Kiln recorded their hashes."""
    shards = index.get(split, {}).get("shards", [])
    if not shards or any(HASH_KEY not in s for s in shards):
        return None
    text = json.dumps([[s["file"], s["tokens"], s[HASH_KEY]] for s in shards])
    return hashlib.sha256(text.encode()).hexdigest()


def write_window_losses(run_dir: Path, split: str, losses: list[float]) -> dict[str, Any]:
    """Write the losses atomically; return the record eval.json keeps of them."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(losses, dtype=np.float64))
    name = windows_file(split)
    with atomic_path(run_dir / name) as tmp:
        tmp.write_bytes(buf.getvalue())
    return {"file": name, "count": len(losses), "sha256": hashlib.sha256(buf.getvalue()).hexdigest()}


def read_window_losses(run_dir: Path, evaluation: dict[str, Any]) -> np.ndarray:
    """The losses eval.json (`evaluation`, read from `run_dir`) records; ValueError naming
    the file when there are none or the file does not match the record."""
    record = evaluation.get("window_losses")
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        raise ValueError(f"{run_dir / 'eval.json'} records no per-window losses (from an "
                         "older `kiln eval`): run `kiln eval` again")
    path = run_dir / Path(record["file"]).name
    if not path.is_file():
        raise ValueError(f"{path} is missing: run `kiln eval` again")
    if file_sha256(path) != record.get("sha256"):
        raise ValueError(f"{path} is not the file {run_dir / 'eval.json'} records (another "
                         "eval's, or cut short): run `kiln eval` again")
    values = np.load(path, allow_pickle=False)
    if values.ndim != 1 or len(values) != record.get("count"):
        raise ValueError(f"{path} holds {values.shape} values, not the {record.get('count')} "
                         "eval.json records")
    return values
