"""The sha256 of each token shard: taken by `kiln tokenize` as it writes the shard, kept in
index.json, and checked cheaply whenever the shards are opened (train, resume, eval).

The shards' fingerprint (`kiln.data.loader.shards_fingerprint`) hashes the index, so with
these in it, shards re-made from other documents, or from the same ones in another order,
with the same token counts fingerprint differently. A shard changed after tokenize (edited
in place, or two files of one size swapped) leaves the index as it was; it is caught by
hashing the file again, but only where its stat (size, mtime, ctime, inode) differs from the
one `checked.json` (beside the index) recorded when its hash was last confirmed: opening
multi-GB shards costs a stat per shard, and a copy of them to another disk is hashed once
(the record is rewritten where the folder is writable; in this process either way). A
change that keeps all four (a write through a `mmap` within one clock tick) is not seen.

The same record and check guard the documents `kiln prepare` wrote (`check_file_hashes`, with
their own message; `kiln.data.prepared`): any folder of files hashed when written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kiln.atomic import write_json_atomic
from kiln.errors import RunDataError
from kiln.hashing import file_sha256

CHECKED = "checked.json"
HASH_KEY = "sha256"  # of each shard entry in index.json

# (resolved path, stat) -> sha256 confirmed in this process: a read-only copy of the shards
# is hashed once per process, not at every validation
_confirmed: dict[tuple[str, tuple[int, ...]], str] = {}


def stat_key(path: Path) -> list[int]:
    """What changes when the file's bytes (or the file under this name) change."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_checked(record: Path) -> dict:
    try:
        checked = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # none or damaged: the shards are hashed again, nothing is trusted
    return checked if isinstance(checked, dict) else {}


def _write_checked(record: Path, checked: dict) -> None:
    try:
        write_json_atomic(record, checked)
    except OSError:  # a read-only copy of the shards: hashed again by the next process
        pass


def record_checked(shard_dir: Path, hashes: dict[str, str], record: Path | None = None) -> None:
    """After `kiln tokenize` wrote the shards (and took their hashes as it wrote them), or
    `kiln prepare` its documents: the stat each hash was taken at, in `record` (default
    `shard_dir/checked.json`)."""
    _write_checked(record or Path(shard_dir) / CHECKED,
                   {name: {HASH_KEY: digest, "stat": stat_key(Path(shard_dir) / name)}
                    for name, digest in hashes.items()})


def _not_the_shard(path: Path, got: str, want: str) -> RunDataError:
    return RunDataError(
        f"{path} is not the shard `kiln tokenize` wrote (its sha256 {got[:16]}, "
        f"{path.parent / 'index.json'} says {want[:16]}: changed in place, or another "
        "shard's file under its name): the shards are damaged; re-run `kiln tokenize`")


def check_shard_hashes(shard_dir: Path, shards: list[dict]) -> list[str]:
    """Refuse a shard whose bytes are not those `kiln tokenize` hashed into the index; return
    the names of the shards that had to be hashed again (their stat changed). Entries without
    a hash (an index from before Kiln recorded them) are skipped."""
    return check_file_hashes(shard_dir, shards, _not_the_shard)


def check_file_hashes(folder: Path, entries: list[dict],
                      refuse: Callable[[Path, str, str], RunDataError],
                      record: Path | None = None) -> list[str]:
    """Raise `refuse(path, its sha256, the recorded one)` for the first entry ({"file": name
    in `folder`, HASH_KEY: hex}) whose file's bytes are not the recorded ones, hashing only
    the files whose stat differs from the one `record` (default `folder/checked.json`)
    confirmed; return the names hashed again. Entries without a hash are skipped."""
    folder = Path(folder)
    record = record or folder / CHECKED
    checked, rehashed = _read_checked(record), {}
    for entry in entries:
        want = entry.get(HASH_KEY)
        if want is None:
            continue
        path = folder / entry["file"]
        key = stat_key(path)
        seen = checked.get(entry["file"])
        if isinstance(seen, dict) and seen.get("stat") == key and seen.get(HASH_KEY) == want:
            continue
        memo = (str(path.resolve()), tuple(key))
        if _confirmed.get(memo) != want:
            got = file_sha256(path)
            if got != want:
                raise refuse(path, got, want)
            _confirmed[memo] = want
        rehashed[entry["file"]] = {HASH_KEY: want, "stat": key}
    if rehashed:
        _write_checked(record, {**checked, **rehashed})
    return list(rehashed)
