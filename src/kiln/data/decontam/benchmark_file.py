"""The records of a benchmark file, in the shapes benchmarks ship in: JSON lines (`.jsonl`,
gzipped as HumanEval's `.jsonl.gz`, with or without a byte-order mark) or one JSON list of
objects (a `.json` export). Anything else fails naming the file and the line, since an item
left out would leave its leak undetected.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".gz")  # left out of a benchmark's name


def benchmark_stem(path: Path) -> str:
    """The file's name without its benchmark suffix (`test.jsonl.gz` -> `test`)."""
    name = path.name
    return next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)


def _text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:  # a cut-off or damaged .gz
        raise ValueError(f"{path}: cannot be read ({e})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 (byte {raw[e.start]:#04x}); save the "
                         "benchmark as UTF-8") from None


def benchmark_records(path: Path | str) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record: where is `path:line` (JSON lines) or `path[i]` (a
    JSON list, i counted from 0)."""
    path = Path(path)
    text = _text(path)
    if text.lstrip().startswith("["):  # one JSON list, however it is laid out
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected JSON lines or a list of objects")
        for i, record in enumerate(records):
            yield _object(f"{path}[{i}]", record)
        return
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg}); a benchmark is JSON "
                             "lines (one object per line) or one list of objects") from None
        yield _object(f"{path}:{line_no}", record)


def _object(where: str, record: object) -> tuple[str, dict]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return where, record
