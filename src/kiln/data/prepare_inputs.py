"""What a prepare reads: each reader stage's inputs and the files stage options name,
fingerprinted (content hashes cached by stat) so that a changed source re-makes the
documents instead of resuming, and a trained run can name what changed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from kiln.atomic import write_text_atomic
from kiln.data.path_options import anchored
from kiln.data.prepare_config import KILN_JUDGE, PrepareConfig
from kiln.data.sources import sources_without_files
from kiln.data.yield_report import LAYOUT_FILE


def _reader_inputs(stage: str, sources: Sequence[str], arxiv: dict) -> list[str] | None:
    """What reader `stage` reads (an empty list: the stdlib), or None for a non-reader."""
    return {"read": list(sources), "arxiv_metadata": [arxiv["snapshot"]],
            "arxiv_sources": [arxiv["source_dir"]]}.get(stage)


STDLIB_SOURCE = "<stdlib>"  # how prepare.json and messages name the default corpus


def sources_read(sig: dict) -> list[str]:
    """The first stage's inputs as prepare.json and error messages name them."""
    inputs = _reader_inputs(sig["stages"][0], sig["sources"], sig["arxiv"])
    return sig["sources"] if inputs is None else inputs or [STDLIB_SOURCE]


def empty_sources(sources: list[str], run_dir: Path) -> list[str]:
    """The sources named in prepare.json (`sources_read`) in which no file is found."""
    return sources_without_files([s for s in sources if s != STDLIB_SOURCE], run_dir)


def input_files(cfg: PrepareConfig, sources: Sequence[str], run_dir: Path,
                 by: str = "content") -> dict:
    """Fingerprint (files, bytes, hash of names, sizes, contents) of what each reader stage reads.

    Part of the resume signature: a file added, removed or changed in a source re-runs prepare
    from scratch instead of resuming (or skipping) a run made from other inputs.
    """
    from kiln.data.sources import fingerprint_files

    cfg = anchored(cfg)  # a file an option names and that is missing is hashed by its path
    arxiv = dataclasses.asdict(cfg.arxiv)
    inputs = {stage: _reader_inputs(stage, sources, arxiv) for stage in cfg.stages}
    inputs |= _option_files(cfg)
    cache = run_dir / "logs" / HASH_CACHE
    known = _load_hash_cache(cache)
    current: dict = {}  # the files read now only: the cache never keeps sources dropped since
    fingerprints = {stage: fingerprint_files(files, exclude=run_dir, known=known, by=by,
                                             record=current)
                    for stage, files in inputs.items() if files is not None}
    if by == "content" and current != known:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps(current, separators=(",", ":")))
    return fingerprints


HASH_CACHE = "source_hashes.json"  # real path -> [size, mtime_ns, ctime_ns, inode, sha256]


def _load_hash_cache(path: Path) -> dict:
    """The content hashes of the last fingerprint ({} if none or damaged: they are re-read)."""
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def changed_inputs(cfg: PrepareConfig, run_dir: Path | str, sources: Sequence[str]) -> list[str]:
    """'stage: before -> now' for each input the run's last prepare read that differs now (a
    file added, removed or edited in a source, a new benchmark file...); [] where nothing
    changed or no prepare has been recorded to compare with."""
    try:
        saved = json.loads((Path(run_dir) / "logs" / "prepare" / LAYOUT_FILE).read_text(
            encoding="utf-8"))["signature"]["input_files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    legacy = any(isinstance(fp, dict) and "by" not in fp for fp in saved.values())
    now = input_files(cfg, sources, Path(run_dir), by="mtime" if legacy else "content")

    def says(fp: dict | None) -> str:
        return "none" if fp is None else f"{fp['files']:,} files, {fp['bytes']:,} bytes"

    changes = []
    for stage in sorted(set(saved) | set(now)):
        before, after = says(saved.get(stage)), says(now.get(stage))
        if saved.get(stage) != now.get(stage):
            edited = (" (the same count and size: a file edited or renamed" + (
                " or touched: this run recorded times, not contents)" if legacy else ")")
                if before == after else "")
            changes.append(f"{stage}: {before} -> {after}{edited}")
    return changes


def _option_files(cfg: PrepareConfig) -> dict[str, list[str]]:
    """Files that stage options name (benchmarks, a tokenizer, a scoring checkpoint): a new
    version of one re-runs prepare like a changed source does, not a resume of stale output.
    A checkpoint is followed through its run's `checkpoints/latest` pointer."""
    on = set(cfg.stages)

    def latest(run: str) -> list[str]:
        return [str(Path(run) / "checkpoints" / "latest")]

    files = {
        "decontaminate": list(cfg.decontaminate.benchmarks),
        "inject_replicas": [f for f in (cfg.inject_replicas.benchmark,
                                        cfg.inject_replicas.tokenizer) if f],
        "brain_rot_m1": [cfg.brain_rot_m1.tokenizer] if cfg.brain_rot_m1.tokenizer else [],
        "brain_rot_arms": [cfg.brain_rot_arms.tokenizer] if cfg.brain_rot_arms.tokenizer else [],
        "perplexity": latest(cfg.perplexity.run_dir) if cfg.perplexity.run_dir else [],
        "brain_rot_m2": (latest(cfg.brain_rot_m2.judge[len(KILN_JUDGE):])
                         if cfg.brain_rot_m2.judge.startswith(KILN_JUDGE) else []),
    }
    return {f"{stage} files": paths for stage, paths in files.items() if stage in on and paths}
