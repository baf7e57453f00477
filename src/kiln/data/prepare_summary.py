"""What a finished prepare made, as prepare.json (what the reader read and skipped, what came
out, each documents file's sha256), or, where nothing came out, why: the reader's skips by
reason with the first files of each, or the stages' drops (NoDocumentsError's message)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from kiln.atomic import write_json_atomic
from kiln.data.prepare_inputs import empty_sources, sources_read
from kiln.data.prepared import HASHES, hash_documents, recorded_hashes
from kiln.data.record_fields import DEFAULT_TEXT_FIELD
from kiln.data.skip_examples import EXAMPLES_DIR, describe, merge_examples
from kiln.data.sources import no_files_message
from kiln.data.yield_report import (
    YIELD_FILE,
    add_token_counts,
    compute_yield,
    flow_stats,
    write_yield_report,
)
from kiln.errors import NoDocumentsError


def write_summary(run_dir: Path, layout: dict, logging_dir: Path, started: float) -> dict:
    """prepare.json: what the reader read (documents, bytes, skips) and what came out
    (`started`: when this prepare began, for the documents files it wrote)."""
    yields = write_yield_report(run_dir, logging_dir)
    first = yields["stages"][0]
    summary = {
        "sources": sources_read(layout["signature"]),
        "max_bytes": layout["signature"]["max_bytes"],
        "documents": first["documents_out"],
        "bytes": first["bytes_out"],
        "skipped": dict(sorted(first["drop_reasons"].items())),
        "stages": list(layout["signature"]["stages"]),
        "tasks": layout["tasks"],
        "documents_out": yields["documents_out"],
        "bytes_out": yields["bytes_out"],
    }
    # spans redacted, and record fields replaced or left out in documents that were kept
    # and texts read as parts
    for key, row_key in (("pii_redactions", "redactions"), ("field_changes", "field_changes"),
                         ("long_texts", "long_texts")):
        total = Counter()
        for row in yields["stages"]:
            total.update(row.get(row_key, {}))
        if total:
            summary[key] = dict(sorted(total.items()))
    benchmarks = {name: b for row in yields["stages"] for name, b in row.get("benchmarks", {}).items()}
    if benchmarks:  # decontamination: items indexed, too short to match, documents hit
        summary["benchmarks"] = benchmarks
    if examples := skip_examples(layout, logging_dir):  # the first files of each skip reason
        summary["skipped_examples"] = examples
    summary[HASHES] = _document_hashes(run_dir, started)
    write_json_atomic(run_dir / "prepare.json", summary)
    add_token_counts(run_dir)  # shards made from these same documents (a re-run) still count
    return summary


def _document_hashes(run_dir: Path, started: float) -> dict[str, str]:
    """Each documents file's sha256 (`kiln.data.prepared`), taken as the prepare that wrote
    them finishes. A resume of a finished prepare (its prepare.json kept) keeps the hashes
    it recorded for the files it did not write again (see `hash_documents`)."""
    if (run_dir / "prepare.json").is_file():
        if (recorded := recorded_hashes(run_dir)) is not None:
            return hash_documents(run_dir, recorded, written_since=started)
        print("note: the documents of the earlier `kiln prepare` (from before Kiln recorded "
              "their sha256) are hashed now, as they are: an edit made to them before now "
              "cannot be told", file=sys.stderr)
    return hash_documents(run_dir)


def skip_examples(layout: dict, logging_dir: Path) -> dict:
    """The files the `read` stage skipped, a few per reason, merged over its tasks ({} for
    the other readers, which note none)."""
    if layout["readers"] != ["read"]:
        return {}
    return merge_examples(logging_dir / EXAMPLES_DIR, layout["tasks"])


def check_not_empty(run_dir: Path, layout: dict, logging_dir: Path, done: int) -> None:
    """After the first `done` phases: if no document flows on (a barrier would crash on an empty
    folder), write the partial yield.json and raise NoDocumentsError saying why."""
    partial = {**layout, "phases": layout["phases"][:done]}
    roles, merged = flow_stats(logging_dir, partial)
    yields = compute_yield({**partial, "steps": roles}, merged)
    if yields["documents_out"] or not yields["stages"]:
        return
    yields["tasks"] = layout["tasks"]
    write_json_atomic(run_dir / YIELD_FILE, yields)
    raise NoDocumentsError(no_documents_message(
        yields, sources_read(layout["signature"]), run_dir, skip_examples(layout, logging_dir),
        layout["signature"].get("text_field", DEFAULT_TEXT_FIELD)))


def no_documents_message(yields: dict, sources: list, run_dir: Path,
                          examples: dict | None = None,
                          text_field: str = DEFAULT_TEXT_FIELD) -> str:
    """Why prepare produced nothing: the reader's skips by reason, with the first files of
    each (`examples`, kiln.data.skip_examples) and the fields of records that lacked
    `text_field`, or the stages' drops."""
    def reasons(counts: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none counted"

    first = yields["stages"][0]
    # a folder with no file in it is not a reader that skipped everything: say which
    empty = empty_sources(sources, run_dir) if first["stage"] == "read" else []
    if not first["documents_out"]:
        key = "data.sources" if first["stage"] == "read" else "prepare.arxiv"
        named = "".join(f"\n  {line}" for line in
                        describe(examples or {}, first["drop_reasons"], text_field))
        why = [f"skipped by reason: {reasons(first['drop_reasons'])}"] \
            if first["drop_reasons"] or not empty else []
        why += [no_files_message(empty)] if empty else []
        return (f"{key}: prepare read no documents from {sources} ({'; '.join(why)}); "
                f"see {run_dir / YIELD_FILE}{named}")
    drops = "; ".join(f"{r['stage']}: {reasons(r['drop_reasons'])}" for r in yields["stages"]
                      if r.get("documents_dropped"))
    # a source that gave nothing is said here too (with documents kept, prepare warns of it)
    return (f"prepare.stages: all {first['documents_out']} documents read from {sources} were "
            f"dropped ({drops}); see {run_dir / YIELD_FILE}"
            + (f"\n  data.sources: {no_files_message(empty)}" if empty else ""))
