"""Report section: documents and bytes in and out of every prepare stage, with drop reasons."""

from __future__ import annotations

from typing import Any

from kiln.report.fmt import as_number, fmt_bytes, fmt_count
from kiln.report.html_parts import grid_table, paragraph, section, unavailable
from kiln.report.run_files import Loaded

TOP_REASONS = 3
HEADERS = ["stage", "docs in", "docs added", "docs out", "bytes in", "bytes out", "kept %",
           "tokens out", "top drop reasons"]


def _kept(docs_in: Any, docs_out: Any, added: Any = 0) -> str:
    """The share of the documents that came in that went out: a stage's own additions
    (injected replicas) are not documents it kept."""
    n_in, n_out = as_number(docs_in), as_number(docs_out)
    if not n_in or n_out is None:
        return "—"
    return f"{100 * (n_out - (as_number(added) or 0)) / n_in:.1f}"


def _reasons(reasons: Any) -> str:
    if isinstance(reasons, dict):  # a reason that dropped nothing is no reason
        reasons = {k: v for k, v in reasons.items() if as_number(v)}
    if not isinstance(reasons, dict) or not reasons:
        return "—"
    top = sorted(reasons.items(), key=lambda kv: -(as_number(kv[1]) or 0))[:TOP_REASONS]
    more = len(reasons) - len(top)
    text = ", ".join(f"{k}: {fmt_count(v)}" for k, v in top)
    return text + (f" (+{more} more)" if more > 0 else "")


def _bytes(value: Any) -> str:
    return "—" if as_number(value) is None else fmt_bytes(value)


BENCHMARK_HEADERS = ["benchmark", "items indexed", "too short to match", "docs removed",
                     "docs tagged"]


def _benchmark_table(stages: list) -> str:
    """Per benchmark of a decontamination stage: items it can and cannot catch, documents hit."""
    rows = [[name, fmt_count(b.get("items")), fmt_count(b.get("too_short_items")),
             fmt_count(b.get("documents_removed")), fmt_count(b.get("documents_tagged"))]
            for s in stages if isinstance(s, dict) and isinstance(s.get("benchmarks"), dict)
            for name, b in s["benchmarks"].items() if isinstance(b, dict)]
    if not rows:
        return ""
    note = paragraph("Items too short to match (fewer words than the n-gram size, and no "
                     "problem long enough to match whole) can never be caught.")
    return note + grid_table(BENCHMARK_HEADERS, rows)


def yield_section(yields: Loaded) -> str:
    """One row per stage of yield.json, then a tokenize row if it records one: `kiln tokenize`
    adds it, and only while the shards were made from these documents (tokens/index.json
    outlives a re-prepare, and its counts would describe documents that are gone).

    Runs prepared before the stage pipeline existed have no yield.json: the section is left
    out rather than shown as missing; an unreadable one is reported.
    """
    if not yields.ok and yields.problem == f"{yields.name} missing":
        return ""
    if not yields.ok:
        return section("Data yield", unavailable(yields.problem or ""))
    data: dict[str, Any] = yields.value
    stages = data.get("stages")
    if not isinstance(stages, list):
        return section("Data yield", unavailable("yield.json has no stages"))
    rows = []
    for s in stages:
        if not isinstance(s, dict):
            continue
        added = s.get("documents_added")
        rows.append([
            str(s.get("stage", "?")), fmt_count(s.get("documents_in")),
            fmt_count(added) if as_number(added) else "—", fmt_count(s.get("documents_out")),
            _bytes(s.get("bytes_in")), _bytes(s.get("bytes_out")),
            _kept(s.get("documents_in"), s.get("documents_out"), added), "—",
            _reasons(s.get("drop_reasons")),
        ])
    tokenize = data.get("tokenize")
    if isinstance(tokenize, dict) and stages:
        # a last stage that is not a table (edited by hand) has no figures: not a traceback
        last = stages[-1] if isinstance(stages[-1], dict) else {}
        docs_in = last.get("documents_out")
        rows.append([
            "tokenize", fmt_count(docs_in), "—", fmt_count(tokenize.get("documents")),
            _bytes(last.get("bytes_out")), _bytes(tokenize.get("bytes")),
            _kept(docs_in, tokenize.get("documents")), fmt_count(tokenize.get("tokens")), "—",
        ])
    kept = as_number(data.get("kept_fraction"))
    added = sum(as_number(s.get("documents_added")) or 0 for s in stages if isinstance(s, dict))
    docs_in, docs_out = fmt_count(data.get("documents_in")), fmt_count(data.get("documents_out"))
    flow = (f"{docs_in} documents in, {fmt_count(added)} added by stages, {docs_out} out"
            if added else
            f"{docs_out} of {docs_in} documents kept ({'—' if kept is None else f'{100 * kept:.1f}%'})")
    note = paragraph(f"{flow}, {data.get('tasks', '?')} task(s). Bytes in of reader stages are "
                     "not measured.")
    return section("Data yield", note + grid_table(HEADERS, rows) + _benchmark_table(stages))
