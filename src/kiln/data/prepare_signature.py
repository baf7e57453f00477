"""A prepare's signature: the settings and inputs its documents were made from, recorded in
logs/prepare. A re-run resumes only under the same signature, and a new model is refused
settings that differ from the recorded ones (its config would not describe its data)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kiln.config import EXECUTION_KEYS
from kiln.data.long_documents import CUT_RULE, CUT_RULE_KEY
from kiln.data.path_options import PATH_OPTIONS, anchored, real_paths
from kiln.data.prepare_config import PrepareConfig, decontaminate_pii_types, unused_option_tables
from kiln.data.prepare_inputs import input_files
from kiln.data.record_fields import DEFAULT_TEXT_FIELD
from kiln.data.stage_rules import RULES_KEYS, STAGE_RULES_KEY, rules_versions, stages_made_otherwise
from kiln.data.yield_report import LAYOUT_FILE


def make_signature(cfg: PrepareConfig, sources: Sequence[str], max_bytes: int,
                   run_dir: Path | None = None, text_field: str = DEFAULT_TEXT_FIELD) -> dict:
    """What the documents are made from: the prepare options (not how they are executed),
    the sources, the cap, and (with `run_dir`) the inputs' fingerprint."""
    options = {k: v for k, v in dataclasses.asdict(anchored(cfg)).items()
               if k not in EXECUTION_KEYS}
    # absolute, as config.toml records them: `kiln prepare RUN` from another folder compares
    # the folders the recipe named, not the same words read against another current folder
    signature = {**options, "sources": [os.path.abspath(s) for s in sources],
                 "max_bytes": max_bytes}
    # another field reads other documents from the same files: a resume would mix them, and
    # the documents' fingerprint (kiln.data.provenance) must change. Recorded only when not
    # the default, so runs prepared before the setting existed keep resuming and their shards
    # stay current.
    if "read" in cfg.stages and text_field != DEFAULT_TEXT_FIELD:
        signature["text_field"] = text_field
    # the counting tokenizer of inject_replicas, likewise only when set: a run that injected
    # before the setting existed counted words, as one without it does now, and keeps resuming
    if not cfg.inject_replicas.tokenizer:
        signature["inject_replicas"].pop("tokenizer", None)
    if not cfg.perplexity.count:  # the same: perplexity selection by a count, when set
        signature["perplexity"].pop("count", None)
    if "decontaminate" in cfg.stages:  # another normalisation: rebuild the index, re-filter
        from kiln.data.decontam.ngram_index import NORMALISATION

        signature["decontaminate_normalisation"] = NORMALISATION
        # a pii stage before it: the index holds the redacted forms of the items too (recorded
        # only then, so other runs keep resuming)
        if decontaminate_pii_types(cfg) is not None:
            signature["decontaminate_pii_forms"] = True
    # the rules of the stages it runs (other rules keep, drop or rewrite other documents:
    # never mixed); only those it runs, so a version bumped for another stage changes nothing
    versions = rules_versions(cfg.stages)
    if versions:
        signature[STAGE_RULES_KEY] = versions
    # the scorer scores a model's whole context (it scored one token fewer before): a
    # resume must not mix the two kinds of score under one threshold
    if "perplexity" in cfg.stages:
        signature["perplexity_scored_tokens"] = "max_seq_len"
    # texts over the reader's limit are cut into parts by this rule; a run whose prepare cut
    # none made the same documents under any rule, so a record without it compares as equal
    # (RULE_MARKERS): only runs that cut texts re-make them
    if "read" in cfg.stages:
        signature[CUT_RULE_KEY] = CUT_RULE
    if run_dir is not None:
        signature["input_files"] = input_files(cfg, sources, run_dir)
    return signature


def saved_layout(logging_dir: Path) -> dict | None:
    try:
        saved = json.loads((logging_dir / LAYOUT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def keep_recorded_times(cfg: PrepareConfig, sources: Sequence[str], run_dir: Path,
                        logging_dir: Path, layout: dict) -> None:
    """A run prepared before contents were hashed recorded its inputs by modification time:
    while they are unchanged by that measure, its record stands (so the prepare resumes and
    the documents' fingerprint, which the shards and checkpoints were made against, stays)."""
    saved = saved_layout(logging_dir)
    recorded = (saved or {}).get("signature", {}).get("input_files")
    if not isinstance(recorded, dict) or not recorded or any(
            not isinstance(fp, dict) or "by" in fp for fp in recorded.values()):
        return
    if input_files(cfg, sources, run_dir, by="mtime") == recorded:
        layout["signature"]["input_files"] = recorded


def keep_recorded_paths(logging_dir: Path, layout: dict) -> None:
    """The same pipeline re-run (`same_pipeline`): its path options stay as recorded, since
    the documents' fingerprint hashes them as written, and a prepare an older Kiln recorded
    with `bench.jsonl`, recorded again as its absolute path, would leave its shards and
    checkpoints made from "other documents"."""
    recorded = (saved_layout(logging_dir) or {}).get("signature", {})
    for table, key in PATH_OPTIONS:
        was, now = recorded.get(table), layout["signature"].get(table)
        if isinstance(was, dict) and isinstance(now, dict) and key in was and key in now:
            now[key] = was[key]


def _against_recorded(logging_dir: Path, signature: dict) -> tuple[dict, dict, dict] | None:
    """(the saved layout, its signature, `signature`), both signatures without the options
    of stages that neither runs; None where no signature is recorded. Those options made no
    document: another value of one (a recipe's decontaminate.n with no decontaminate stage)
    is the same pipeline, and no data setting."""
    saved = saved_layout(logging_dir)
    if saved is None or not isinstance(saved.get("signature"), dict):
        return None
    before, now = real_paths(saved["signature"]), real_paths(signature)
    stages = [s for s in (before.get("stages"), now.get("stages")) if isinstance(s, list)]
    for table in unused_option_tables(*stages):
        before.pop(table, None)
        now.pop(table, None)
    return saved, before, now


@dataclasses.dataclass(frozen=True)
class RuleMarker:
    """A rule of how this Kiln makes documents that a prepare records (no user setting): a
    prepare made under another one, or under none (by a Kiln from before it was recorded),
    is made again rather than resumed, and a trained run's is refused before (its documents
    are the ones its checkpoints were trained on: `kiln.commands.early_refusals`)."""

    what: str  # "documents whose <what>": the rule, to the user
    # where a record without the marker made the same documents as this rule would (judged
    # from its logs), so a run from before it keeps its data
    unrecorded_is_same: Callable[[Path], bool] | None = None


def _cut_none(logging_dir: Path) -> bool:
    return not cut_texts(logging_dir)


RULE_MARKERS = {
    "decontaminate_normalisation": RuleMarker(
        "benchmark n-grams were matched under an earlier text normalisation (decontaminate)"),
    "decontaminate_pii_forms": RuleMarker(
        "decontaminate index was built by an earlier rule for the items' redacted forms (pii)"),
    "perplexity_scored_tokens": RuleMarker(
        "perplexity scores were taken by an earlier rule (one token fewer than a context)"),
    # a run whose prepare cut no text made the same documents under any rule
    CUT_RULE_KEY: RuleMarker("long texts were cut into parts by an earlier rule", _cut_none),
}


def _rules_otherwise(before: dict, now: dict, logging_dir: Path) -> list[str]:
    """How (words to follow "documents whose") the recorded signature `before` made its
    documents otherwise than `now`: the RULE_MARKERS it holds otherwise (a key one lacks
    differs, unless the marker says the record's data is the same), then the rules versions
    of the stages `now` runs (`kiln.data.stage_rules`: one the record lacks differs)."""
    out = []
    for key, marker in RULE_MARKERS.items():
        if before.get(key) == now.get(key):
            continue
        if (key in now and key not in before and marker.unrecorded_is_same is not None
                and marker.unrecorded_is_same(logging_dir)):
            continue
        out.append(marker.what)
    return out + stages_made_otherwise(before, now)


def same_pipeline(logging_dir: Path, layout: dict) -> bool:
    compared = _against_recorded(logging_dir, layout["signature"])
    if compared is None:
        return False
    saved, before, now = compared
    before["sources"], now["sources"] = (_real(before.get("sources")), _real(now["sources"]))
    if _rules_otherwise(before, now, logging_dir):
        return False
    for key in (*RULE_MARKERS, *RULES_KEYS):
        before.pop(key, None)
        now.pop(key, None)
    return before == now and saved.get("phases") == layout["phases"]


def cut_texts(logging_dir: Path) -> bool:
    """Whether a task of the recorded prepare that finished cut a text into parts (its stats
    count `long_texts_split`; the reader runs in the first phase, whose stats are in
    `logging_dir`/stats). An unreadable stats file counts as one that did: re-made, not
    resumed. The tasks that did not finish are run again from the start on a resume."""
    for path in sorted((logging_dir / "stats").glob("*.json")):
        try:
            steps = json.loads(path.read_text(encoding="utf-8"))
            if any("long_texts_split" in step.get("stats", {}) for step in steps):
                return True
        except (OSError, ValueError, TypeError, AttributeError):
            return True
    return False


def rules_made_otherwise(cfg: PrepareConfig, sources: Sequence[str], max_bytes: int,
                         logging_dir: Path, text_field: str = DEFAULT_TEXT_FIELD) -> list[str]:
    """How (RULE_MARKERS' words, and the stages whose rules changed) the recorded prepare
    made its documents otherwise than this Kiln would, so that `same_pipeline` makes them
    again; [] where none is recorded."""
    compared = _against_recorded(logging_dir,
                                 make_signature(cfg, sources, max_bytes, None, text_field))
    if compared is None:
        return []
    _, before, now = compared
    return _rules_otherwise(before, now, logging_dir)


# signature entries that are no setting a user gives (how a stage works in this Kiln, the
# inputs' fingerprint), or that change how the documents are made, not what (the number of
# tasks: where it makes other documents, with data.max_bytes, their fingerprint tells)
_NOT_SETTINGS = ("input_files", "keep_rejected", "tasks", *RULE_MARKERS, *RULES_KEYS)


_DATA_KEYS = {"sources": "data.sources", "max_bytes": "data.max_bytes",
              "text_field": "data.text_field"}


def prepare_settings_differ(cfg: PrepareConfig, run_dir: Path | str, sources: Sequence[str],
                            max_bytes: int, text_field: str = DEFAULT_TEXT_FIELD) -> list[str]:
    """'key: made with X, set to Y' for each setting the run's last prepare made its
    documents with (its recorded signature) that these differ from: a new model trained on
    them would record settings that do not describe its data, and the next `kiln run` would
    re-make the data under it. [] where no prepare is recorded; a setting the record lacks
    (a Kiln from before it existed) is not compared."""
    compared = _against_recorded(Path(run_dir) / "logs" / "prepare",
                                 make_signature(cfg, sources, max_bytes, None, text_field))
    if compared is None:
        return []
    _, before, now = compared
    before.setdefault("text_field", DEFAULT_TEXT_FIELD)  # recorded only when not the default
    now.setdefault("text_field", DEFAULT_TEXT_FIELD)
    out = []
    for key in now:
        if key in _NOT_SETTINGS or key not in before:
            continue
        was, set_to = before[key], now[key]
        if key == "sources":
            was, set_to = _real(was), _real(set_to)
        pairs = ({f"{key}.{k}": (was.get(k), v) for k, v in set_to.items() if k in was}
                 if isinstance(was, dict) and isinstance(set_to, dict) else {key: (was, set_to)})
        out += [f"{_DATA_KEYS.get(name, f'prepare.{name}')}: made with {a!r}, set to {b!r}"
                for name, (a, b) in pairs.items() if a != b]
    return out


def _real(sources: object) -> object:
    """`d`, `d/`, `./d` and a link to d are one source (the files read are fingerprinted)."""
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        return sources
    return [os.path.realpath(x) for x in sources]
