"""Which inputs `kiln prepare`'s reader skipped: a few files (and the line or row) per reason.

A count (`skipped/non_utf8 = 1,200`) says that something is wrong, not where: the user needs
a file to open. For records without the text field (`no_text`) and parquet files without the
column (`no_text_column`), it also keeps the field or column names they do have: most often
the text is there under another name (`content`), and `data.text_field` reads it. For a
format not read (`csv`, `html`), the warning says how to make it readable.

Memory and output stay bounded however much is skipped: per task and reason, the first
`MAX_EXAMPLES` files (each with how many it lost and where first), and per such file at most
`MAX_FIELDS` names, from its first `FIELD_SAMPLE_RECORDS` records without the field. Each task writes its examples to `logs/prepare/skipped_examples/
NNNNN.json` (its datatrove stats beside hold numbers only); `merge_examples` joins them by the
files' order in the source listing, so the examples named are the first files in that order
whatever the task count, as the merged counts are the same whatever it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kiln import strict_json
from kiln.data.sources import READ_FORMATS

MAX_EXAMPLES = 5  # files named per reason
MAX_FIELDS = 20  # field / column names kept per file
FIELD_SAMPLE_RECORDS = 100  # records of a file whose field names are looked at
MAX_NAME_CHARS = 60  # a longer field name is cut (a JSON key can be any string)
FIELD_REASONS = ("no_text", "no_text_column")  # the text field / column is not there
# where datasets often keep their text; one seen is suggested as data.text_field
LIKELY_TEXT_FIELDS = ("text", "content", "raw_content", "contents", "body", "document",
                      "article", "passage", "story")
EXAMPLES_DIR = "skipped_examples"  # under the reader's logging folder (logs/prepare)
# formats counted as skipped rather than read as text (kiln.data.sources.NOT_READ_SUFFIXES):
# what makes them readable
FORMAT_HINTS = {
    "csv": ('CSV / TSV files are not read (as text, a table is one document of delimiters): '
            'save it as .jsonl or .parquet with a "{field}" column'),
    "html": ("HTML files are not read (as text, a page is its markup): extract the text "
             "first (trafilatura, for one) into .txt or .jsonl"),
}


class SkipExamples:
    """One task's examples: reason -> {"files": files with that reason, "examples": [...]}.

    An example is {"file", "order" (the file's index in the whole source listing), "count",
    and the first "line" / "row" / "record" where a line-level skip happened, with the "key"
    path of a .json object's records}; for `several_record_lists`, the reader adds "keys"
    (those of the lists); for
    `FIELD_REASONS`, `note_fields` adds "fields" (the names seen) and "not_string" (records
    whose text field was there but null, a number or a list). Files must be added in listing
    order, as the reader reads them.
    """

    def __init__(self) -> None:
        self.reasons: dict[str, dict] = {}
        self._last: dict[str, int] = {}  # reason -> order of the last file counted

    def add(self, reason: str, order: int, file: str, value: int = 1,
            where: tuple[str, int] | None = None, key: str | None = None) -> dict | None:
        """Count `value` skips of `reason` in `file`; the file's example if it is kept.
        `key`: the key path of the records in a .json object (`data`), noted as "key"."""
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
        if key is not None:
            example["key"] = key
        examples.append(example)
        return example

    def to_json(self) -> dict:
        return {reason: {"files": e["files"], "examples": [
            {k: v for k, v in x.items() if k != "sampled"} for x in e["examples"]]}
            for reason, e in sorted(self.reasons.items())}


def shown_name(name: str) -> str:
    """A field name as short, valid UTF-8 text (a lone surrogate is escaped)."""
    name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS - 3] + "..."


def note_fields(example: dict | None, names: Iterable[str], has_field: bool,
                value: object = None) -> None:
    """Note a skipped record's field names (or a parquet file's columns) in its file's
    `example` (None: the file is not among those named); `has_field`: the text field was
    there, but not a string: `value`, unless null, is named ("held": a list, a number...),
    since it may hold the text in another shape."""
    if example is None:
        return
    if has_field:
        example["not_string"] = example.get("not_string", 0) + 1
        if value is not None and (kind := _json_kind(value)) not in example.setdefault("held", []):
            example["held"].append(kind)
    sampled = example.get("sampled", 0)
    if sampled >= FIELD_SAMPLE_RECORDS:  # the first records say it; the rest cost nothing
        return
    example["sampled"] = sampled + 1
    fields = example.setdefault("fields", [])
    for name in names:
        if len(fields) >= MAX_FIELDS:
            break
        if (shown := shown_name(str(name))) not in fields:
            fields.append(shown)


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
            found = strict_json.loads((Path(folder) / f"{rank:05d}.json").read_text(encoding="utf-8"))
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
    """`data/a.jsonl:3` for a line, `p.parquet (row 12)` for a row, `d.json (record 4 of
    "data")` for an entry of a wrapped list, the file alone else."""
    if "line" in example:
        return f"{example['file']}:{example['line']}"
    if "nested_deeper_than" in example:
        return f"{example['file']} (nested deeper than {example['nested_deeper_than']} levels)"
    for key in ("row", "record"):
        if key in example:
            return f"{example['file']} ({key} {example[key]}{_of(example)})"
    return example["file"]


def _of(example: dict) -> str:
    return f' of "{example["key"]}"' if "key" in example else ""


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def field_hint(reason: str, example: dict, text_field: str) -> str | None:
    """For a file skipped for lacking the text field: the fields it has, and the setting
    that reads one; for records whose field held no string but a list, a number...: what it
    held (in a file with both, both are named); None if its records had the field, null."""
    if reason not in FIELD_REASONS:
        return None
    missing = example["count"] - example.get("not_string", 0)
    held = None
    if example.get("held"):
        join = "; join a list of paragraphs into one text" if "a list" in example["held"] else ""
        held = (f'"{text_field}" holds {" or ".join(example["held"])}, not a string, in '
                f"records skipped as no_text: only a string is read{join}")
    if missing <= 0:
        return f'{example["file"]}: {held}' if held else None
    hint = _missing_field_hint(reason, example, text_field, missing)
    # a file mixing both: the records whose field held a list were left out of the count
    return f"{hint}; in others, {held}" if held else hint


def _missing_field_hint(reason: str, example: dict, text_field: str, missing: int) -> str:
    """The hint for `missing` records (or a parquet file) without the text field."""
    fields = sorted(example.get("fields", []))
    if not fields:
        return (f'{example["file"]}: {missing:,} records have no "{text_field}" field, nor any '
                'other (are they JSON objects?)')
    names = ", ".join(fields) + (", ..." if len(fields) >= MAX_FIELDS else "")
    if reason == "no_text_column":
        what = f'{example["file"]}: no "{text_field}" column (columns: {names})'
    else:
        under = f' under "{example["key"]}"' if "key" in example else ""
        what = (f'{example["file"]}: {missing:,} record{"s" if missing != 1 else ""}{under} '
                f'{"have" if missing != 1 else "has"} no "{text_field}" field (fields seen: {names})')
    if "." in text_field and text_field.split(".")[0] in fields:  # `meta.body`: a path
        return (f"{what}; data.text_field names a top-level field, not a path into a nested "
                "one: move the text up to a field of its own")
    likely = [f for f in LIKELY_TEXT_FIELDS if f in fields and f != text_field]
    if likely:
        return f"{what}; to read {likely[0]!r}: --set data.text_field={likely[0]}"
    return f"{what}; set data.text_field to the one that holds the text"


def lists_hint(example: dict) -> str:
    """For a .json object that wraps several lists of records (a dataset's splits): which,
    and what reads the one wanted (none is guessed: a `test` split is not training data)."""
    keys = ", ".join(f'"{k}"' for k in example.get("keys", []))
    return (f"{example['file']}: records under several keys ({keys}), none read, since which "
            "to train on is not guessed: save the list to train on as a .json list or .jsonl "
            "file of its own")


def describe(examples: dict, counts: dict[str, int], text_field: str = "text") -> list[str]:
    """One short line per reason: how many (`counts`, the reader's skip counts), in how
    many files, and the first few of them with what each lost; then, for each file named
    that lacks the text field (`text_field`), the fields it has instead."""
    lines = []
    # files with the same fields (a dataset's shards) share one hint, naming them all
    alike: dict[tuple, list[dict]] = {}
    for reason, entry in examples.items():
        for e in entry["examples"]:
            alike.setdefault((reason, tuple(sorted(e.get("fields", []))), e.get("key"),
                              tuple(e.get("held", []))), []).append(e)
    hints = [h for (reason, _, key, _), group in alike.items() if (h := field_hint(reason, {
        "file": ", ".join(e["file"] for e in group), "count": sum(e["count"] for e in group),
        "not_string": sum(e.get("not_string", 0) for e in group),
        "held": list(dict.fromkeys(k for e in group for k in e.get("held", []))),
        "fields": group[0].get("fields", []), **({"key": key} if key else {})}, text_field))]
    hints += [lists_hint(e) for e in examples.get("several_record_lists", {}).get("examples", [])]
    for reason, entry in examples.items():
        files, shown = entry["files"], entry["examples"]
        named = ", ".join(where(e) + (f" ({e['count']:,})" if e["count"] > 1 else "")
                          for e in shown)
        more = f" and {files - len(shown):,} more" if files > len(shown) else ""
        lines.append(f"skipped {reason} ({counts.get(reason, 0):,} in {files:,} "
                     f"file{'s' if files != 1 else ''}): {named}{more}")
    formats = [FORMAT_HINTS[r].format(field=text_field) for r in examples if r in FORMAT_HINTS]
    if formats:
        hints.append("; ".join(formats) + f"; the read stage reads {READ_FORMATS}")
    return lines + hints
