"""How many documents and bytes go into and come out of every prepare stage, and why some are lost.

Counting is done by `YieldMeter` steps that the pipeline builder puts after every stage, not by
trusting each stage's own stats keys: a formatter, a reader or a multi-step dedup counts the
same way as a BaseFilter. Drop *reasons* do come from the stages' own stats (`dropped_<reason>`
from datatrove's BaseFilter, `skipped/<reason>` from readers); whatever a stage drops without a
reason is reported as "unattributed", so in = out + dropped always holds.

Steps that count drops under other keys (dedup filters, the arXiv readers) or add documents
(injected replicas) are read through `STEP_REASONS`; every row satisfies
in + added = out + dropped, and the drop reasons sum to the dropped count.

Numbers are merged from the per-task stats files datatrove writes (logging_dir/stats/NNNNN.json,
one logging folder per executor phase when a barrier stage splits the pipeline), so a resumed
run, whose executor only returns the stats of the tasks it re-ran, still reports the whole
corpus. Tokens are added from tokens/index.json once `kiln tokenize` has run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln import strict_json
from kiln.atomic import write_json_atomic

YIELD_FILE = "yield.json"
LAYOUT_FILE = "kiln_pipeline.json"  # in the logging dir: stage of every step, reader stages
REASON_PREFIXES = ("dropped_", "dropped/", "skipped/")
UNATTRIBUTED = "unattributed"

# Steps whose drops are not counted as `dropped_<reason>`: stat key (prefix) -> reason (prefix).
# "added" names stats counting documents a step creates (injected replicas).
STEP_REASONS: dict[str, dict[str, Any]] = {
    "ExactDedupFilter": {"keys": {"dropped": "duplicate"}},
    "MinhashDedupFilter": {"keys": {"dropped": "near_duplicate"}},
    "ArxivMetadataFilter": {"prefixes": {"metadata/dropped/": "metadata_"}},
    "ArxivSourceReader": {"prefixes": {"invalid/": "invalid_", "empty_tex/": "empty_tex_"},
                          "keys": {"missing_source": "missing_source"}},
    "LatexToText": {"prefixes": {"empty_tex/": "empty_tex_", "error/": "error_",
                                 "refused/": "refused_"}},
    "InjectReplicas": {"keys": {"web_docs_dropped": "replaced_by_replicas"},
                       "added": ["replicas"]},
}


def reason_spec(step: object) -> dict[str, Any]:
    """How to read drop reasons (and added documents) from this step's stats, for the layout."""
    spec = STEP_REASONS.get(type(step).__name__, {})
    return {
        "prefixes": {**{p: "" for p in REASON_PREFIXES}, **spec.get("prefixes", {})},
        "keys": dict(spec.get("keys", {})),
        "added": list(spec.get("added", [])),
    }


class YieldMeter(PipelineStep):
    """Pass documents through unchanged, counting documents and UTF-8 bytes after `stage`."""

    type = "📊 - YIELD"

    def __init__(self, stage: str):
        self.name = f"after {stage}"  # before super().__init__: the Stats block is named from it
        super().__init__()
        self.stage = stage

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data or ():
            self.stat_update("documents")
            self.stat_update("bytes", value=len(doc.text.encode("utf-8")))
            yield doc


def _total(value: Any) -> float:
    """A datatrove MetricStats as saved: a bare number, or a dict with "total"."""
    if isinstance(value, dict):
        return float(value.get("total", 0))
    return float(value)


def merge_task_stats(logging_dir: Path | str, tasks: int) -> list[dict[str, Any]]:
    """Sum every step's counters over the per-task stats files of ranks 0..tasks-1.

    Raises FileNotFoundError naming the ranks whose stats are missing (unfinished tasks).
    """
    stats_dir = Path(logging_dir) / "stats"
    missing = [r for r in range(tasks) if not (stats_dir / f"{r:05d}.json").is_file()]
    if missing:
        raise FileNotFoundError(
            f"no stats for prepare task(s) {missing[:10]} in {stats_dir}: those tasks have not "
            "finished; re-run `kiln prepare` (completed tasks are skipped)"
        )
    merged: list[dict[str, Any]] = []
    for rank in range(tasks):
        steps = json.loads((stats_dir / f"{rank:05d}.json").read_text(encoding="utf-8"))
        if not merged:
            merged = [{"name": s["name"], "counts": Counter()} for s in steps]
        if [s["name"] for s in steps] != [m["name"] for m in merged]:
            raise ValueError(f"task {rank} ran a different pipeline than task 0 ({stats_dir})")
        for into, step in zip(merged, steps, strict=True):
            for key, value in step.get("stats", {}).items():
                into["counts"][key] += _total(value)
    return merged


def _reasons(counts: Counter, spec: dict | None = None) -> dict[str, int]:
    spec = spec or reason_spec(None)
    found: Counter[str] = Counter()
    for key, value in counts.items():
        if key in spec["keys"]:
            found[spec["keys"][key]] += int(value)
            continue
        for prefix, label in spec["prefixes"].items():
            if key.startswith(prefix) and len(key) > len(prefix):
                found[label + key[len(prefix):]] += int(value)
                break
    return {reason: n for reason, n in found.most_common() if n}  # none dropped: no reason


def _redactions(counts: Counter) -> Counter[str]:
    """{PII type: spans replaced} from a PII redactor's `pii_<type>` stats."""
    return Counter({key[len("pii_"):].upper(): int(value) for key, value in counts.items()
                    if key.startswith("pii_") and not key.startswith("pii_docs_with_")})


def _field_changes(counts: Counter) -> Counter[str]:
    """{change: records} from a reader's `fields/<change>` stats: record fields replaced or
    left out while the document itself was kept (it is in no drop reason)."""
    return Counter({key[len("fields/"):]: int(value) for key, value in counts.items()
                    if key.startswith("fields/") and len(key) > len("fields/")})


def _added(counts: Counter, spec: dict | None) -> int:
    return sum(int(counts.get(key, 0)) for key in (spec or {}).get("added", []))


def _benchmarks(record: dict | None, counts: Counter) -> dict[str, Any]:
    """A decontamination stage's benchmarks: items indexed, items too short to ever match
    (from the layout's record), and documents removed or tagged for each (from its stats)."""
    if not record or "benchmarks" not in record:
        return {}
    action = "documents_tagged" if record.get("mode") == "tag" else "documents_removed"
    found = {name: {**info, action: int(counts.get(f"contaminated/{name}", 0))}
             for name, info in record["benchmarks"].items()}
    tagged = {"documents_tagged": int(counts.get("tagged", 0))} if record.get("mode") == "tag" else {}
    return {"benchmarks": found, **tagged}


def _edited(counts: Counter) -> dict[str, Any]:
    """The bytes of the documents a text-editing filter kept, before and after its edits
    (`MeasuredC4QualityFilter`'s line removals): {} where no step measured any."""
    if "edited_bytes_in" not in counts:
        return {}
    return {"edited": {"bytes_in": int(counts["edited_bytes_in"]),
                       "bytes_out": int(counts.get("edited_bytes_out", 0))}}


def _long_texts(counts: Counter) -> dict[str, Any]:
    """Texts over the reader's limit, each read as parts (kiln.data.long_documents): how
    many, and the documents they became (each part counts as a document in and out)."""
    if not counts.get("long_texts_split"):
        return {}
    return {"long_texts": {"texts": int(counts["long_texts_split"]),
                           "parts": int(counts.get("parts", 0))}}


def compute_yield(layout: dict, merged: list[dict[str, Any]]) -> dict:
    """Rows of documents/bytes in and out per stage, from the layout and merged counters."""
    roles = layout["steps"]
    if len(roles) != len(merged):
        raise ValueError(f"stats have {len(merged)} steps but the pipeline has {len(roles)}")
    rows: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    redacted: Counter[str] = Counter()
    fields: Counter[str] = Counter()
    added = 0
    stage_counts: Counter[str] = Counter()  # the stage's own stats, for its record
    prev_docs = prev_bytes = None
    for role, step in zip(roles, merged, strict=True):
        if role["meter"] is False:
            stage_counts += step["counts"]
            for reason, n in _reasons(step["counts"], role.get("reasons")).items():
                reasons[reason] += n
            added += _added(step["counts"], role.get("reasons"))
            redacted += _redactions(step["counts"])
            fields += _field_changes(step["counts"])
            continue
        docs_out = int(step["counts"].get("documents", 0))
        bytes_out = int(step["counts"].get("bytes", 0))
        stage = role["stage"]
        if stage in layout["readers"] or prev_docs is None:
            docs_in = docs_out + sum(reasons.values()) - added
            bytes_in = None  # bytes of unreadable or skipped inputs are not measured
        else:
            docs_in, bytes_in = prev_docs, prev_bytes
        dropped = docs_in + added - docs_out
        attributed = sum(reasons.values())
        if dropped > attributed:
            reasons[UNATTRIBUTED] += dropped - attributed
        rows.append({
            "stage": stage,
            "documents_in": docs_in,
            "documents_out": docs_out,
            "documents_added": added,
            "documents_dropped": dropped,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "bytes_removed": None if bytes_in is None else bytes_in - bytes_out,
            "kept_fraction": docs_out / docs_in if docs_in else None,
            "drop_reasons": dict(reasons.most_common()),
            **({"redactions": dict(sorted(redacted.items()))} if redacted else {}),
            **({"field_changes": dict(sorted(fields.items()))} if fields else {}),
            **_edited(stage_counts),
            **_long_texts(stage_counts),
            **_benchmarks(layout.get("records", {}).get(stage), stage_counts),
        })
        reasons, redacted, fields, added = Counter(), Counter(), Counter(), 0
        stage_counts = Counter()
        prev_docs, prev_bytes = docs_out, bytes_out
    first, last = (rows[0], rows[-1]) if rows else ({}, {})
    return {
        "stages": rows,
        "documents_in": first.get("documents_in", 0),
        "documents_out": last.get("documents_out", 0),
        "bytes_out": last.get("bytes_out", 0),
        "kept_fraction": (last["documents_out"] / first["documents_in"]
                          if rows and first["documents_in"] else None),
    }


def token_counts(index: dict) -> dict:
    """Documents, bytes and tokens that `kiln tokenize` wrote (both splits), from its index."""
    splits = [index[s] for s in ("train", "val") if isinstance(index.get(s), dict)]
    docs = sum(int(s.get("documents", 0)) for s in splits)
    nbytes = sum(int(s.get("bytes", 0)) for s in splits)
    tokens = sum(int(s.get("tokens", 0)) for s in splits)
    return {"documents": docs, "bytes": nbytes, "tokens": tokens,
            "bytes_per_token": nbytes / tokens if tokens else None}


def flow_stats(logging_dir: Path | str, layout: dict) -> tuple[list[dict], list[dict[str, Any]]]:
    """(roles, merged stats) of every step the documents flow through, over all phases.

    A pipeline with a barrier stage (dedup) runs as several executor phases, each with its own
    logging folder under `logging_dir`; only the phases documents flow through ("flow") count,
    not helper phases such as signature or bucket passes. A layout without phases is one phase.
    """
    phases = layout.get("phases") or [
        {"dir": "", "tasks": layout["tasks"], "flow": True, "steps": layout["steps"]}]
    roles: list[dict] = []
    merged: list[dict[str, Any]] = []
    for phase in phases:
        if not phase["flow"]:
            continue
        stats = merge_task_stats(Path(logging_dir) / phase["dir"], phase["tasks"])
        if len(stats) != len(phase["steps"]):
            raise ValueError(f"phase {phase.get('name', phase['dir'])!r}: stats have {len(stats)} "
                             f"steps but the pipeline has {len(phase['steps'])}")
        roles += phase["steps"]
        merged += stats
    return roles, merged


def write_yield_report(run_dir: Path | str, logging_dir: Path | str | None = None) -> dict:
    """Merge the prepare stats of `run_dir` into run_dir/yield.json (atomically); return it."""
    run_dir = Path(run_dir)
    logging_dir = Path(logging_dir) if logging_dir else run_dir / "logs" / "prepare"
    layout_path = logging_dir / LAYOUT_FILE
    if not layout_path.is_file():
        raise FileNotFoundError(f"no prepare pipeline recorded at {layout_path}; run `kiln prepare`")
    layout = strict_json.loads(layout_path.read_text(encoding="utf-8"))
    roles, merged = flow_stats(logging_dir, layout)
    report = compute_yield({**layout, "steps": roles}, merged)
    report["tasks"] = layout["tasks"]
    write_json_atomic(run_dir / YIELD_FILE, report)
    return report


def add_token_counts(run_dir: Path | str) -> dict | None:
    """After `kiln tokenize`, or a prepare that re-made the same documents: add the token
    counts to an existing yield.json; None if it is absent, if the shards were made from
    other documents (their counts would describe data that is gone), or if it is unreadable
    or not a JSON object (left as it is: a report, never a reason to fail a tokenize that
    has written its shards; `kiln report` says it is unreadable)."""
    from kiln.data.provenance import tokens_match_documents

    run_dir = Path(run_dir)
    path, index = run_dir / YIELD_FILE, run_dir / "tokens" / "index.json"
    if not path.is_file() or not index.is_file() or not tokens_match_documents(run_dir):
        return None
    try:
        report = strict_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(report, dict):
        return None
    report["tokenize"] = token_counts(strict_json.loads(index.read_text(encoding="utf-8")))
    write_json_atomic(path, report)
    return report
