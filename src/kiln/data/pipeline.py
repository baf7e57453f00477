"""`kiln prepare` as a configurable chain of datatrove steps: stage registry, builder, runner.

A stage is named in `prepare.stages` and built by a factory `factory(ctx: StageContext)` (see
`kiln.data.stages`) that returns a PipelineStep, a list of them, or a `StagePlan`. Factories are
imported only when the stage is configured, so a pipeline that does not use a stage never needs
its dependencies, and one that does gets an error naming the stage and the missing module.
After every stage the builder inserts a `YieldMeter`, from which `yield.json` is computed.

Most stages stream: a document goes in, zero or one comes out. A *barrier* stage (exact or
MinHash dedup, perplexity selection by a global threshold) must see the whole corpus before it
decides, so the runner cuts the pipeline there into executor phases: the steps before it write
an intermediate documents folder (prepare_work/), the barrier's helper phases run over that
folder (signatures, buckets, thresholds), and a new phase reads it back, applies the barrier's
decision and continues with the following stages. Setup phases that need no documents (building
a decontamination index) run first. Every phase is a datatrove executor with its own logging
folder (logs/prepare for the first, logs/prepare/phases/NN_name for the others), chained in
order, so resume is by task in every phase and yield counting spans all of them.

The same phases run under datatrove's local, Slurm (chained with `depends`) or Ray executor.
Input files are sharded by task (file i goes to task i % tasks); every task writes
documents/NNNNN.jsonl.gz. A re-run of the same pipeline (same stages, options, sources, input
files (names, sizes, mtimes) and task count) skips the tasks already completed; `redo=True` (or
any change, such as a file added to a source folder) starts from scratch.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln import strict_json
from kiln.atomic import new_archive_folder, write_json_atomic, write_text_atomic
from kiln.config import EXECUTION_KEYS
from kiln.data.documents import DEFAULT_TEXT_FIELD
from kiln.data.prepare_config import (  # noqa: F401  (re-exported: the pipeline's vocabulary)
    ARXIV_STAGES,
    DEFAULT_STAGES,
    EXECUTORS,
    QUICKSTART_STAGES,
    STAGES,
    PrepareConfig,
    StageSpec,
    decontaminate_pii_types,
    unused_option_tables,
    validate_prepare,
)
from kiln.data.prepared import HASHES, hash_documents, recorded_hashes
from kiln.data.skip_examples import EXAMPLES_DIR, describe, merge_examples
from kiln.data.sources import no_files_message, sources_without_files
from kiln.data.yield_report import (
    LAYOUT_FILE,
    YIELD_FILE,
    YieldMeter,
    add_token_counts,
    compute_yield,
    flow_stats,
    reason_spec,
    write_yield_report,
)
from kiln.errors import ConfigError, NoDocumentsError

if TYPE_CHECKING:  # the executors are imported when one is made
    from datatrove.executor.base import PipelineExecutor

WORK_DIR = "prepare_work"  # intermediate documents and barrier state, under the run directory


class StageUnavailableError(ImportError):
    """A configured stage whose module (or factory, or a dependency of it) cannot be imported."""


@dataclass
class StageContext:
    """What a stage factory may use: the config, the run directory, the sources and how
    their records are read (`text_field`: data.text_field)."""

    name: str
    cfg: PrepareConfig
    run_dir: Path
    sources: list[str]
    max_bytes: int = 0
    progress: bool = True
    text_field: str = DEFAULT_TEXT_FIELD

    @property
    def examples_dir(self) -> Path:
        """Where the reader's tasks note what they skipped: in the first phase's logging
        folder (the reader is always in that phase), kept and cleared with its stats."""
        return self.run_dir / "logs" / "prepare" / EXAMPLES_DIR

    @property
    def work_dir(self) -> Path:
        """This stage's scratch folder (index files, signatures, thresholds)."""
        return self.run_dir / WORK_DIR / self.name

    def exclusion_writer(self, part: str = "") -> DiskWriter | None:
        """A JsonlWriter for this stage's dropped documents if prepare.keep_rejected, else None."""
        if not self.cfg.keep_rejected:
            return None
        from datatrove.pipeline.writers import JsonlWriter

        folder = self.run_dir / "rejected" / self.name
        return JsonlWriter(str(folder / part if part else folder))


@dataclass
class Phase:
    """One executor's worth of work: its steps, task count, and whether documents flow through."""

    name: str
    pipeline: list[PipelineStep]
    tasks: int
    flow: bool = False
    roles: list[dict] = field(default_factory=list)
    dir: str = ""  # logging folder, relative to logs/prepare


Barrier = Callable[[Callable[[], PipelineStep], Path], tuple[list, list[PipelineStep]]]


@dataclass
class StagePlan:
    """A stage that is more than streaming steps.

    - `setup`: phases (objects with name, pipeline, tasks) that need no documents, run first.
    - `barrier(make_reader, work_dir) -> (phases, steps)`: the stage needs the whole input
      first. `make_reader()` reads the input of the stage back; `phases` run over it in order;
      `steps` then apply the decision to the re-read documents, in the stream.
    - `steps`: streaming steps (used when there is no barrier).
    - `record`: what the stage's yield row notes beside the counts (the benchmarks indexed),
      known when it is built; kept in the layout for the yield record.
    """

    steps: list[PipelineStep] = field(default_factory=list)
    setup: list = field(default_factory=list)
    barrier: Barrier | None = None
    record: dict = field(default_factory=dict)


def register_stage(name: str, target: str | Callable, reader: bool = False) -> None:
    """Add or replace a stage; `target` is "module:function" or the factory itself."""
    if callable(target):
        _FACTORIES[name] = target
        target = f"{target.__module__}:{target.__qualname__}"
    STAGES[name] = StageSpec(target, reader)


_FACTORIES: dict[str, Callable] = {}  # factories registered as objects (not importable paths)


def resolve_factory(name: str) -> Callable[[StageContext], PipelineStep | Sequence | StagePlan]:
    """Import the stage's factory now, or raise StageUnavailableError naming what is missing."""
    if name not in STAGES:
        close = difflib.get_close_matches(name, list(STAGES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"prepare.stages: unknown stage '{name}'{hint}; known: {sorted(STAGES)}")
    if name in _FACTORIES:
        return _FACTORIES[name]
    module_name, _, attr = STAGES[name].target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        what = "is not available" if e.name and module_name.startswith(e.name) else (
            f"needs the missing module '{e.name}'")
        raise StageUnavailableError(
            f"prepare stage '{name}': module {module_name} {what} ({e}); "
            f"remove '{name}' from prepare.stages or install what it needs"
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise StageUnavailableError(
            f"prepare stage '{name}': {module_name} has no stage factory '{attr}(ctx)'"
        )
    return factory


def _as_plan(name: str, made) -> StagePlan:
    if isinstance(made, StagePlan):
        return made
    steps = list(made) if isinstance(made, (list, tuple)) else [made]
    for step in steps:
        if hasattr(step, "pipeline") and hasattr(step, "tasks"):
            raise NotImplementedError(
                f"prepare stage '{name}' returned executor phases such as "
                f"{getattr(step, 'name', step)!r}: return a StagePlan with a barrier instead"
            )
    return StagePlan(steps=steps)


def _check_step(name: str, step: object) -> PipelineStep:
    if not isinstance(step, PipelineStep):
        raise TypeError(f"prepare stage '{name}' returned {step!r}, not a PipelineStep")
    return step


def _role(stage: str, step: PipelineStep, meter: bool = False, handoff: bool = False) -> dict:
    role = {"stage": stage, "meter": meter, "step": str(step)}
    if handoff:
        role["handoff"] = True
    if not meter:
        role["reasons"] = reason_spec(step)
    return role


def _reader_inputs(stage: str, sources: Sequence[str], arxiv: dict) -> list[str] | None:
    """What reader `stage` reads (an empty list: the stdlib), or None for a non-reader."""
    return {"read": list(sources), "arxiv_metadata": [arxiv["snapshot"]],
            "arxiv_sources": [arxiv["source_dir"]]}.get(stage)


STDLIB_SOURCE = "<stdlib>"  # how prepare.json and messages name the default corpus


def _sources_read(sig: dict) -> list[str]:
    """The first stage's inputs as prepare.json and error messages name them."""
    inputs = _reader_inputs(sig["stages"][0], sig["sources"], sig["arxiv"])
    return sig["sources"] if inputs is None else inputs or [STDLIB_SOURCE]


def empty_sources(sources: list[str], run_dir: Path) -> list[str]:
    """The sources named in prepare.json (`_sources_read`) in which no file is found."""
    return sources_without_files([s for s in sources if s != STDLIB_SOURCE], run_dir)


def _input_files(cfg: PrepareConfig, sources: Sequence[str], run_dir: Path,
                 by: str = "content") -> dict:
    """Fingerprint (files, bytes, hash of names, sizes, contents) of what each reader stage reads.

    Part of the resume signature: a file added, removed or changed in a source re-runs prepare
    from scratch instead of resuming (or skipping) a run made from other inputs.
    """
    from kiln.data.sources import fingerprint_files

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
    now = _input_files(cfg, sources, Path(run_dir), by="mtime" if legacy else "content")

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
        "inject_replicas": [cfg.inject_replicas.benchmark] if cfg.inject_replicas.benchmark else [],
        "brain_rot_m1": [cfg.brain_rot_m1.tokenizer] if cfg.brain_rot_m1.tokenizer else [],
        "perplexity": latest(cfg.perplexity.run_dir) if cfg.perplexity.run_dir else [],
        "brain_rot_m2": (latest(cfg.brain_rot_m2.judge[len("kiln:"):])
                         if cfg.brain_rot_m2.judge.startswith("kiln:") else []),
    }
    return {f"{stage} files": paths for stage, paths in files.items() if stage in on and paths}


def _signature(cfg: PrepareConfig, sources: Sequence[str], max_bytes: int,
               run_dir: Path | None = None, text_field: str = DEFAULT_TEXT_FIELD) -> dict:
    options = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in EXECUTION_KEYS}
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
    if "decontaminate" in cfg.stages:  # another normalisation: rebuild the index, re-filter
        from kiln.data.decontam.ngram_index import NORMALISATION

        signature["decontaminate_normalisation"] = NORMALISATION
        # a pii stage before it: the index holds the redacted forms of the items too (recorded
        # only then, so other runs keep resuming)
        if decontaminate_pii_types(cfg) is not None:
            signature["decontaminate_pii_forms"] = True
    # the scorer scores a model's whole context (it scored one token fewer before): a
    # resume must not mix the two kinds of score under one threshold
    if "perplexity" in cfg.stages:
        signature["perplexity_scored_tokens"] = "max_seq_len"
    if run_dir is not None:
        signature["input_files"] = _input_files(cfg, sources, run_dir)
    return signature


def absolute_run_dir(run_dir: Path | str) -> Path:
    """The run directory as an absolute path, before any datatrove folder is made from it:
    fsspec caches those folders by the path as given, so a relative one made again after
    an `os.chdir` (a second prepare in one process) would be the first folder."""
    return Path(os.path.abspath(run_dir))


def build_pipeline(
    cfg: PrepareConfig,
    run_dir: Path | str,
    sources: Sequence[str] = (),
    max_bytes: int = 0,
    progress: bool = True,
    text_field: str = DEFAULT_TEXT_FIELD,
) -> tuple[list[Phase], dict]:
    """The executor phases of the configured stages (each stage followed by a YieldMeter), in
    run order, and their layout (stage of every step, phases, signature) for yield and resume.

    Nothing is run or written; factories check their inputs here (missing files fail now).
    `text_field`: the record field / parquet column the `read` stage takes the text from.
    """
    validate_prepare(cfg, making_data=True)
    run_dir = absolute_run_dir(run_dir)
    setup: list[Phase] = []
    phases: list[Phase] = []
    steps: list[PipelineStep] = []
    roles: list[dict] = []
    records: dict[str, dict] = {}
    for name in cfg.stages:
        ctx = StageContext(name, cfg, run_dir, list(sources), max_bytes, progress, text_field)
        plan = _as_plan(name, resolve_factory(name)(ctx))
        if plan.record:
            records[name] = plan.record
        for i, p in enumerate(plan.setup):
            setup.append(Phase(f"setup_{name}_{i}_{p.name}", [_check_step(name, s) for s in p.pipeline],
                               p.tasks))
        stream = plan.steps
        if plan.barrier is not None:
            handoff = run_dir / WORK_DIR / f"documents_before_{name}"
            writer = _handoff_writer(handoff)
            steps.append(writer)
            roles.append(_role(name, writer, handoff=True))
            phases.append(Phase(f"until_{name}", steps, cfg.tasks, flow=True, roles=roles))

            def make_reader(folder: Path = handoff) -> PipelineStep:
                from datatrove.pipeline.readers import JsonlReader

                return JsonlReader(str(folder), glob_pattern="*.jsonl.gz", add_file_path=False)

            helpers, stream = plan.barrier(make_reader, ctx.work_dir)
            for p in helpers:
                phases.append(Phase(f"{name}_{p.name}", [_check_step(name, s) for s in p.pipeline],
                                    p.tasks))
            reader = make_reader()
            steps, roles = [reader], [_role(name, reader, handoff=True)]
        for step in stream:
            steps.append(_check_step(name, step))
            roles.append(_role(name, step))
        steps.append(YieldMeter(name))
        roles.append(_role(name, steps[-1], meter=True))
    phases.append(Phase("main" if not phases else "after_barriers", steps, cfg.tasks, flow=True,
                        roles=roles))
    ordered = setup + phases
    for i, phase in enumerate(ordered):
        phase.dir = "" if phase is phases[0] else f"phases/{i:02d}_{phase.name}"
    layout = {
        "phases": [{"name": p.name, "dir": p.dir, "tasks": p.tasks, "flow": p.flow,
                    "steps": p.roles if p.flow else [{"step": str(s)} for s in p.pipeline]}
                   for p in ordered],
        "readers": [cfg.stages[0]],
        "records": records,
        "tasks": cfg.tasks,
        "signature": _signature(cfg, sources, max_bytes, run_dir, text_field),
    }
    layout["steps"] = [r for p in layout["phases"] if p["flow"] for r in p["steps"]]
    return ordered, layout


def _handoff_writer(folder: Path) -> PipelineStep:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(folder))


def make_executor(cfg: PrepareConfig, steps: list[PipelineStep], logging_dir: Path,
                  skip_completed: bool, tasks: int | None = None,
                  depends: PipelineExecutor | None = None,
                  progress: bool = True) -> PipelineExecutor:
    """The datatrove executor named by prepare.executor, with a clear error if it can't run.
    `progress`: whether the local tasks show progress bars (datatrove's own too)."""
    tasks = tasks or cfg.tasks
    workers = min(cfg.workers, tasks)
    common = {"tasks": tasks, "logging_dir": str(logging_dir), "skip_completed": skip_completed}
    if cfg.executor == "local":
        from kiln.data.quiet_executor import KilnLocalExecutor

        return KilnLocalExecutor(steps, workers=workers, quiet=not cfg.console_logs,
                                 progress=progress, **common)
    if cfg.executor == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        if shutil.which("sbatch") is None:
            raise RuntimeError("prepare.executor = 'slurm' but `sbatch` is not on PATH")
        return SlurmPipelineExecutor(
            steps, time=cfg.slurm_time, partition=cfg.slurm_partition, workers=cfg.workers,
            cpus_per_task=cfg.cpus_per_task, mem_per_cpu_gb=cfg.mem_per_cpu_gb,
            job_name="kiln_prepare", depends=depends, **common)
    if cfg.executor == "ray":
        if importlib.util.find_spec("ray") is None:
            raise RuntimeError("prepare.executor = 'ray' needs the `ray` package (pip install ray)")
        from datatrove.executor import RayPipelineExecutor

        return RayPipelineExecutor(steps, workers=workers, cpus_per_task=cfg.cpus_per_task,
                                   mem_per_cpu_gb=cfg.mem_per_cpu_gb, **common)
    raise ConfigError(f"prepare.executor: '{cfg.executor}' is not one of {list(EXECUTORS)}")


def _same_pipeline(logging_dir: Path, layout: dict) -> bool:
    saved = _saved_layout(logging_dir)
    if saved is None or not isinstance(saved.get("signature"), dict):
        return False
    before, now = dict(saved["signature"]), dict(layout["signature"])
    before["sources"], now["sources"] = (_real(before.get("sources")), _real(now["sources"]))
    # the options of a stage that does not run made no document: another value of one (a
    # recipe's decontaminate.n with no decontaminate stage) is the same pipeline
    stages = [before.get("stages"), now["stages"]]
    for table in unused_option_tables(*(s for s in stages if isinstance(s, list))):
        before.pop(table, None)
        now.pop(table, None)
    return before == now and saved.get("phases") == layout["phases"]


# signature entries that are no setting a user gives (how a stage works in this Kiln, the
# inputs' fingerprint), or that change how the documents are made, not what (the number of
# tasks: where it makes other documents, with data.max_bytes, their fingerprint tells)
_NOT_SETTINGS = ("input_files", "keep_rejected", "tasks", "decontaminate_normalisation",
                 "decontaminate_pii_forms", "perplexity_scored_tokens")
_DATA_KEYS = {"sources": "data.sources", "max_bytes": "data.max_bytes",
              "text_field": "data.text_field"}


def prepare_settings_differ(cfg: PrepareConfig, run_dir: Path | str, sources: Sequence[str],
                            max_bytes: int, text_field: str = DEFAULT_TEXT_FIELD) -> list[str]:
    """'key: made with X, set to Y' for each setting the run's last prepare made its
    documents with (its recorded signature) that these differ from: a new model trained on
    them would record settings that do not describe its data, and the next `kiln run` would
    re-make the data under it. [] where no prepare is recorded; a setting the record lacks
    (a Kiln from before it existed) is not compared."""
    saved = _saved_layout(Path(run_dir) / "logs" / "prepare")
    if saved is None or not isinstance(saved.get("signature"), dict):
        return []
    before, now = dict(saved["signature"]), _signature(cfg, sources, max_bytes, None, text_field)
    if isinstance(before.get("stages"), list):
        for table in unused_option_tables(before["stages"], now["stages"]):
            before.pop(table, None)
            now.pop(table, None)
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


def _saved_layout(logging_dir: Path) -> dict | None:
    try:
        saved = json.loads((logging_dir / LAYOUT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _keep_recorded_times(cfg: PrepareConfig, sources: Sequence[str], run_dir: Path,
                         logging_dir: Path, layout: dict) -> None:
    """A run prepared before contents were hashed recorded its inputs by modification time:
    while they are unchanged by that measure, its record stands (so the prepare resumes and
    the documents' fingerprint, which the shards and checkpoints were made against, stays)."""
    saved = _saved_layout(logging_dir)
    recorded = (saved or {}).get("signature", {}).get("input_files")
    if not isinstance(recorded, dict) or not recorded or any(
            not isinstance(fp, dict) or "by" in fp for fp in recorded.values()):
        return
    if _input_files(cfg, sources, run_dir, by="mtime") == recorded:
        layout["signature"]["input_files"] = recorded


_OUTPUT_FOLDERS = ("documents", "rejected", WORK_DIR, "logs/prepare")


def _refuse_foreign_folders(run_dir: Path) -> None:
    """prepare replaces its output folders: never ones it did not write (a user's own
    `documents/` in a folder chosen as run.dir). Kiln's prepare records its pipeline in
    logs/prepare before it writes any of them."""
    if (run_dir / "logs" / "prepare" / LAYOUT_FILE).is_file() or (run_dir / "prepare.json").is_file():
        return
    foreign = [name for name in _OUTPUT_FOLDERS if (run_dir / name).is_file()
               or ((run_dir / name).is_dir() and any((run_dir / name).iterdir()))]
    if foreign:
        raise ConfigError(f"run.dir {run_dir} already holds {', '.join(foreign)}, "
                          "which `kiln prepare` did not write and would replace: set run.dir "
                          "to another folder (or move them away)")


def _clear_outputs(run_dir: Path, keep_earlier: bool) -> None:
    """Out of the new pipeline's way. With `keep_earlier` (other settings or sources), a
    finished earlier prepare's documents move to archive/before-prepare-*/ (a re-make with a
    wrong source or an over-eager filter must not throw hours of work away); a re-make of
    the same (prepare.resume = false) and an unfinished one's partial outputs go."""
    _refuse_foreign_folders(run_dir)
    if keep_earlier and (run_dir / "prepare.json").is_file() and (run_dir / "documents").is_dir():
        dest = new_archive_folder(run_dir, "before-prepare")
        for name in ("prepare.json", "yield.json", "documents", "rejected", "logs/prepare"):
            if (run_dir / name).exists():
                os.replace(run_dir / name, dest / Path(name).name)
        print(f"prepare: the earlier documents (made with other settings or sources) moved to "
              f"{dest}; delete it once the new ones are right", file=sys.stderr)
    for name in ("prepare.json", "yield.json"):
        (run_dir / name).unlink(missing_ok=True)
    for folder in _OUTPUT_FOLDERS:
        shutil.rmtree(run_dir / folder, ignore_errors=True)


def _summary(run_dir: Path, layout: dict, logging_dir: Path, started: float) -> dict:
    """prepare.json: what the reader read (documents, bytes, skips) and what came out
    (`started`: when this prepare began, for the documents files it wrote)."""
    yields = write_yield_report(run_dir, logging_dir)
    first = yields["stages"][0]
    summary = {
        "sources": _sources_read(layout["signature"]),
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
    if examples := _skip_examples(layout, logging_dir):  # the first files of each skip reason
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


def _skip_examples(layout: dict, logging_dir: Path) -> dict:
    """The files the `read` stage skipped, a few per reason, merged over its tasks ({} for
    the other readers, which note none)."""
    if layout["readers"] != ["read"]:
        return {}
    return merge_examples(logging_dir / EXAMPLES_DIR, layout["tasks"])


def _finished(logging_dir: Path, phase: Phase) -> bool:
    folder = logging_dir / phase.dir
    return all((folder / "completions" / f"{r:05d}").is_file() for r in range(phase.tasks))


def run_prepare(
    cfg: PrepareConfig,
    run_dir: Path | str,
    sources: Sequence[str] = (),
    max_bytes: int = 0,
    redo: bool = False,
    progress: bool = True,
    text_field: str = DEFAULT_TEXT_FIELD,
) -> dict:
    """Build and run the prepare pipeline; write prepare.json and yield.json; return the summary.

    `max_bytes` caps each task's reader; `text_field` is the record field / parquet column
    read as the text (data.text_field; a change re-reads, not resumes). Local and Ray phases
    run one after the other, each checked complete before the next starts; Slurm phases are
    submitted as a chain of dependent job arrays: the summary says so, and
    `kiln.data.yield_report.write_yield_report(run_dir)` gives the yield once they finish. A
    run that leaves no documents raises NoDocumentsError naming the reader's skip counts by
    reason, with the first files of each (or the stages' drops); prepare.json and yield.json
    stay.
    """
    run_dir = absolute_run_dir(run_dir)
    phases, layout = build_pipeline(cfg, run_dir, sources, max_bytes, progress, text_field)
    logging_dir = run_dir / "logs" / "prepare"
    _keep_recorded_times(cfg, sources, run_dir, logging_dir, layout)
    same = _same_pipeline(logging_dir, layout)
    resume = cfg.resume and not redo and same
    if not resume:
        _clear_outputs(run_dir, keep_earlier=not same)
    elif cfg.executor != "slurm" and all(_finished(logging_dir, p) for p in phases):
        print(f"prepare: kept {run_dir / 'documents'} (every task finished before, with these "
              "settings and sources; prepare.resume = false makes them again)", file=sys.stderr)
    # a resume keeps prepare.json: it describes this same pipeline's finished documents (it is
    # written only when every task finished) and marks them as worth archiving if a later
    # prepare with other settings replaces them, even when this resume is interrupted
    write_json_atomic(logging_dir / LAYOUT_FILE, layout)
    started = time.time()
    previous = None
    for phase in phases:
        executor = make_executor(cfg, phase.pipeline, logging_dir / phase.dir, resume,
                                 tasks=phase.tasks, depends=previous, progress=progress)
        if cfg.executor == "slurm":
            previous = executor
            continue
        executor.run()
        if not _finished(logging_dir, phase):
            raise RuntimeError(f"prepare phase {phase.name!r} did not complete every task; see "
                               f"{logging_dir / phase.dir / 'logs'} and re-run to resume")
        if phase.flow and phase is not phases[-1]:
            _check_not_empty(run_dir, layout, logging_dir, phases.index(phase) + 1)
    if previous is not None:
        previous.run()  # submits the whole chain of dependent jobs
    if not all(_finished(logging_dir, p) for p in phases):
        return {"status": "submitted", "executor": cfg.executor, "logging_dir": str(logging_dir)}
    summary = _summary(run_dir, layout, logging_dir, started)
    if not summary["documents_out"]:
        yields = strict_json.loads((run_dir / YIELD_FILE).read_text(encoding="utf-8"))
        raise NoDocumentsError(_no_documents_message(yields, summary["sources"], run_dir,
                                                      summary.get("skipped_examples", {}),
                                                      text_field))
    return summary


def _check_not_empty(run_dir: Path, layout: dict, logging_dir: Path, done: int) -> None:
    """After the first `done` phases: if no document flows on (a barrier would crash on an empty
    folder), write the partial yield.json and raise NoDocumentsError saying why."""
    partial = {**layout, "phases": layout["phases"][:done]}
    roles, merged = flow_stats(logging_dir, partial)
    yields = compute_yield({**partial, "steps": roles}, merged)
    if yields["documents_out"] or not yields["stages"]:
        return
    yields["tasks"] = layout["tasks"]
    write_json_atomic(run_dir / YIELD_FILE, yields)
    raise NoDocumentsError(_no_documents_message(
        yields, _sources_read(layout["signature"]), run_dir, _skip_examples(layout, logging_dir),
        layout["signature"].get("text_field", DEFAULT_TEXT_FIELD)))


def _no_documents_message(yields: dict, sources: list, run_dir: Path,
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


__all__ = [
    "ARXIV_STAGES", "DEFAULT_STAGES", "QUICKSTART_STAGES", "STAGES", "Phase", "PrepareConfig",
    "StageContext", "StagePlan", "StageSpec", "StageUnavailableError", "build_pipeline",
    "flow_stats", "make_executor", "register_stage", "resolve_factory", "run_prepare",
    "validate_prepare",
]
