"""Each evaluated window's mean loss, kept beside eval.json so two runs scored on the same
held-out windows can be set against each other (`kiln report --compare`: Hedges' g,
`kiln.eval.effect_size`).

Each rank keeps its own windows' losses in a preallocated float64 tensor (8 bytes a window,
never a Python float each) and rank 0 gathers them a chunk at a time into the split's order
(`gather_window_losses`): a whole train split costs each rank 8 bytes per window it scored,
and rank 0 8 more per window of the split, with no collective larger than `GATHER_WINDOWS`
windows per rank.

The file is float64 `.npy`, one value per window in the split's order, written atomically
before eval.json, which records its name, count and sha256: a file that does not match the
record (an eval killed between the two writes, or a file from another eval) is refused, not
read. eval.json also records `split_sha256`, a hash of the split's shard hashes from
tokens/index.json: the same value means the same tokens, so the windows pair up.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.atomic import atomic_path
from kiln.data.shard_hashes import HASH_KEY
from kiln.eval import windows_file
from kiln.hashing import file_sha256

if TYPE_CHECKING:  # torch only where a model is scored: `kiln report` reads these files
    import torch

    from kiln.data.loader import EvalBatches
    from kiln.parallel.distributed import DistEnv

# windows each rank sends per gather (8 MB of float64): the collective stays small whatever
# the split's size
GATHER_WINDOWS = 1 << 20


def split_sha256(index: dict[str, Any], split: str) -> str | None:
    """A hash of `split`'s shards (names, token counts, sha256s) from index.json; None for
    shards from before Kiln recorded their hashes."""
    shards = index.get(split, {}).get("shards", [])
    if not shards or any(HASH_KEY not in s for s in shards):
        return None
    text = json.dumps([[s["file"], s["tokens"], s[HASH_KEY]] for s in shards])
    return hashlib.sha256(text.encode()).hexdigest()


def gather_window_losses(mine: torch.Tensor, batches: EvalBatches, env: DistEnv,
                         per_call: int = GATHER_WINDOWS) -> np.ndarray | None:
    """Every window's loss in the split's order on rank 0 (float64; None on the other ranks)
    from each rank's `mine` (`batches.rank_slots` values: its j-th batch, the split's batch
    rank + j x world, at j x batch_size), gathered `per_call` windows per rank at a time.
    Batch b of rank r = b % world sits at row j = b // world, so the (rows, world, batch)
    layout flattened is the split's order; the unused tail slots fall after the last window."""
    from kiln.parallel.distributed import gather_on_main

    size, world = batches.batch_size, env.world_size
    rows = batches.rank_slots // size
    out = np.empty((rows, world, size)) if env.is_main else None
    step = max(1, per_call // size)
    for j0 in range(0, rows, step):
        j1 = min(j0 + step, rows)
        got = gather_on_main(mine[j0 * size : j1 * size], env)  # (world, (j1 - j0) x size)
        if out is not None and got is not None:
            out[j0:j1] = got.view(world, j1 - j0, size).transpose(0, 1).cpu().numpy()
    return None if out is None else out.reshape(-1)[: batches.scored_windows]


def write_window_losses(run_dir: Path, split: str, losses: np.ndarray | list[float],
                        ) -> dict[str, Any]:
    """Write the losses atomically; return the record eval.json keeps of them. Saved to a
    plain file, which numpy writes straight from the array (through a file-like object it
    copies 16 MB chunks), then hashed from the file."""
    values = np.ascontiguousarray(losses, dtype=np.float64)
    name = windows_file(split)
    with atomic_path(run_dir / name) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, values, allow_pickle=False)
        digest = file_sha256(tmp)
    return {"file": name, "count": len(values), "sha256": digest}


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
