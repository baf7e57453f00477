"""Read ``metrics.jsonl`` the way every consumer should: tolerant and deduplicated.

A killed run can leave a half-written last line, and a resumed run re-logs the
steps after its checkpoint, so readers skip lines that do not parse and keep
only the last record for each ``(kind, step)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from kiln import strict_json

# Large per-record fields the report reads from the newest record only: an MoE run logs each
# layer's per-expert load (trinity-nano: 54 x 128 floats, ~225 KB a record once parsed), and
# keeping it on every record made a 100,000-record report need ~22 GB.
NEWEST_ONLY = ("moe_load",)


def read_metrics(path: str | Path,
                 newest_only: tuple[str, ...] = NEWEST_ONLY) -> list[dict[str, Any]]:
    """Return the metric records of ``path``, last record per (kind, step) winning.

    Records are ordered by where their surviving copy appears in the file, so a
    resumed run reads as one continuous sequence. Lines that are blank, not JSON,
    or not JSON objects are skipped; records without an integer ``step`` are all
    kept. Raises ``FileNotFoundError`` when the file does not exist.

    Keys (and ``kind``) are shared among the records: json gives each line its own copies,
    which were half the memory of a million-record file (~1 KB a record, over a gigabyte).
    Fields in `newest_only` (the report's: `NEWEST_ONLY`) are kept on the newest surviving
    record holding them alone; `()` keeps every field of every record.
    """
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    names: dict[str, str] = {}
    holders: dict[str, tuple[dict[str, Any], int]] = {}  # field -> (record, its line's offset)
    with open(path, "rb") as f:
        offset = 0
        for index, raw in enumerate(f):
            at, offset = offset, offset + len(raw)
            record = _parsed(raw)
            if record is None:
                continue
            record = {names.setdefault(k, k): v for k, v in record.items()}
            if isinstance(kind := record.get("kind"), str):
                record["kind"] = names.setdefault(kind, kind)
            for field in newest_only:
                if field in record:
                    if (held := holders.get(field)) is not None:
                        held[0][field] = _LineAt(held[1])  # the value goes; where it was stays
                    holders[field] = (record, at)
            # a kind that is a list or an object (edited by hand) is no key: kept as is, not
            # a TypeError that cost the whole report (no consumer reads such a record)
            kind = record.get("kind")
            keyed = has_step(record) and (kind is None or isinstance(kind, str))
            key = (kind, record["step"]) if keyed else ("<no step>", index)
            latest.pop(key, None)  # re-insert so order follows the last occurrence
            latest[key] = record
        records = list(latest.values())
        for field in holders:
            _settle(field, records, f)
    return records


class _LineAt(int):
    """Where in the file the line of a record that held a newest-only field starts: the
    value, dropped while reading, is read again only if that record turns out the newest
    surviving holder (every newer one was replaced by a re-logged copy without the field)."""

    __slots__ = ()


def _parsed(raw: bytes) -> dict[str, Any] | None:
    """The JSON object a line holds, or None (blank, not JSON, not an object). A damaged
    line may be JSON Python refuses to hold (a run of over 4,300 digits: ValueError; arrays
    nested past the recursion limit: RecursionError): skipped like any other, where either
    failed the whole report with a traceback."""
    line = raw.decode("utf-8", errors="replace").strip()
    if not line:
        return None
    try:
        record = strict_json.loads(line)
    except (ValueError, RecursionError):  # json.JSONDecodeError is a ValueError
        return None
    return record if isinstance(record, dict) else None


def _settle(field: str, records: list[dict[str, Any]], f: BinaryIO) -> None:
    """Leave `field` on the last of `records` that held it, its value read again from `f`
    where only its line's place was kept, and on no other."""
    newest = next((r for r in reversed(records) if field in r), None)
    for record in records:
        if record is not newest and type(record.get(field)) is _LineAt:
            del record[field]
    if newest is None or type(at := newest[field]) is not _LineAt:
        return
    f.seek(at)
    again = _parsed(f.readline())
    if again is not None and field in again and all(
            again.get(k) == newest.get(k) for k in ("kind", "step")):
        newest[field] = again[field]
    else:  # the file changed under the reader: better no value than another record's
        del newest[field]


def has_step(record: dict[str, Any]) -> bool:
    """Whether `record` carries a step: an integer, and not a bool (which Python counts as
    one), so the reader and every consumer agree on which records have one."""
    step = record.get("step")
    return isinstance(step, int) and not isinstance(step, bool)


def records_of_kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of one ``kind`` that carry a step, sorted by step."""
    chosen = [r for r in records if r.get("kind") == kind and has_step(r)]
    return sorted(chosen, key=lambda r: r["step"])
