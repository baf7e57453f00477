"""Which inputs `kiln prepare`'s reader skipped: a few files (and the line or row) per reason.

A count (`skipped/non_utf8 = 1,200`) says that something is wrong, not where: the user needs
a file to open.

Memory and output stay bounded however much is skipped: per task and reason, the first
`MAX_EXAMPLES` files (each with how many it lost and where first). Each task writes its examples to `logs/prepare/skipped_examples/
NNNNN.json` (its datatrove stats beside hold numbers only); `merge_examples` joins them by the
files' order in the source listing, so the examples named are the first files in that order
whatever the task count, as the merged counts are the same whatever it is.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_EXAMPLES = 5  # files named per reason
EXAMPLES_DIR = "skipped_examples"  # under the reader's logging folder (logs/prepare)


class SkipExamples:
    """One task's examples: reason -> {"files": files with that reason, "examples": [...]}.

    An example is {"file", "order" (the file's index in the whole source listing), "count",
    and the first "line" / "row" / "record" where a line-level skip happened}. Files must
    be added in listing order, as the reader reads them.
    """

    def __init__(self) -> None:
        self.reasons: dict[str, dict] = {}
        self._last: dict[str, int] = {}  # reason -> order of the last file counted

    def add(self, reason: str, order: int, file: str, value: int = 1,
            where: tuple[str, int] | None = None) -> dict | None:
        """Count `value` skips of `reason` in `file`; the file's example if it is kept."""
        entry = self.reasons.setdefault(reason, {"files": 0, "examples": []})
        if self._last.get(reason) != order:
            self._last[reason] = order
            entry["files"] += 1
        examples = entry["examples"]
        if examples and examples[-1]["order"] == order:
            examples[-1]["count"] += value
            return examples[-1]
        if len(examples) >= MAX_EXAMPLES:
            return None
        example = {"file": file, "order": order, "count": value}
        if where is not None:
            example[where[0]] = where[1]
        examples.append(example)
        return example

    def to_json(self) -> dict:
        return {reason: {"files": e["files"], "examples": [dict(x) for x in e["examples"]]}
                for reason, e in sorted(self.reasons.items())}


def write_task_examples(folder: Path, rank: int, examples: SkipExamples) -> None:
    from kiln.atomic import write_json_atomic

    write_json_atomic(Path(folder) / f"{rank:05d}.json", examples.to_json())


def merge_examples(folder: Path | str, tasks: int) -> dict:
    """The tasks' examples as one: per reason, files summed and the first `MAX_EXAMPLES`
    files in listing order (each task kept its first ones, so these are among them). A task
    with no file (a run resumed from before Kiln wrote them) adds nothing."""
    merged: dict[str, dict] = {}
    for rank in range(tasks):
        try:
            found = json.loads((Path(folder) / f"{rank:05d}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(found, dict):
            continue
        for reason, entry in found.items():
            into = merged.setdefault(reason, {"files": 0, "examples": []})
            into["files"] += int(entry.get("files", 0))
            into["examples"] += list(entry.get("examples", []))
    out = {}
    for reason in sorted(merged):
        examples = sorted(merged[reason]["examples"], key=lambda e: e.get("order", 0))
        out[reason] = {"files": merged[reason]["files"], "examples": [
            {k: v for k, v in e.items() if k != "order"}
            for e in examples[:MAX_EXAMPLES]]}
    return out


def where(example: dict) -> str:
    """`data/a.jsonl:3` for a line, `p.parquet (row 12)` for a row, the file alone else."""
    if "line" in example:
        return f"{example['file']}:{example['line']}"
    for key in ("row", "record"):
        if key in example:
            return f"{example['file']} ({key} {example[key]})"
    return example["file"]


def describe(examples: dict, counts: dict[str, int]) -> list[str]:
    """One short line per reason: how many (`counts`, the reader's skip counts), in how
    many files, and the first few of them with what each lost."""
    lines = []
    for reason, entry in examples.items():
        files, shown = entry["files"], entry["examples"]
        named = ", ".join(where(e) + (f" ({e['count']:,})" if e["count"] > 1 else "")
                          for e in shown)
        more = f" and {files - len(shown):,} more" if files > len(shown) else ""
        lines.append(f"skipped {reason} ({counts.get(reason, 0):,} in {files:,} "
                     f"file{'s' if files != 1 else ''}): {named}{more}")
    return lines
