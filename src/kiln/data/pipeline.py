"""`kiln prepare` as a configurable chain of datatrove steps: the builder and the runner.

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

The stage contract and registry live in stage_registry, the inputs' fingerprint in
prepare_inputs, the resume signature in prepare_signature, the executors in
prepare_executor, the output folders' clearing in prepare_outputs and prepare.json (or why
no document came out) in prepare_summary; the names others import stay importable here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from kiln import strict_json
from kiln.atomic import write_json_atomic
from kiln.data.documents import DEFAULT_TEXT_FIELD
from kiln.data.prepare_checks import validate_prepare
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
)
from kiln.data.prepare_executor import make_executor
from kiln.data.prepare_inputs import (  # noqa: F401  (re-exported)
    HASH_CACHE,
    STDLIB_SOURCE,
    changed_inputs,
    empty_sources,
)
from kiln.data.prepare_outputs import clear_outputs
from kiln.data.prepare_signature import (  # noqa: F401  (re-exported)
    keep_recorded_paths,
    keep_recorded_times,
    make_signature,
    rules_made_otherwise,
    same_pipeline,
)
from kiln.data.prepare_summary import check_not_empty, no_documents_message, write_summary
from kiln.data.stage_registry import (  # noqa: F401  (re-exported: the stage contract)
    WORK_DIR,
    Barrier,
    StageContext,
    StagePlan,
    StageUnavailableError,
    register_stage,
    resolve_factory,
)
from kiln.data.yield_report import (  # noqa: F401  (flow_stats re-exported)
    LAYOUT_FILE,
    YIELD_FILE,
    YieldMeter,
    flow_stats,
    reason_spec,
)
from kiln.errors import NoDocumentsError


@dataclass
class Phase:
    """One executor's worth of work: its steps, task count, and whether documents flow through."""

    name: str
    pipeline: list[PipelineStep]
    tasks: int
    flow: bool = False
    roles: list[dict] = field(default_factory=list)
    dir: str = ""  # logging folder, relative to logs/prepare


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
        "signature": make_signature(cfg, sources, max_bytes, run_dir, text_field),
    }
    layout["steps"] = [r for p in layout["phases"] if p["flow"] for r in p["steps"]]
    return ordered, layout


def _handoff_writer(folder: Path) -> PipelineStep:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(folder))


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
    keep_recorded_times(cfg, sources, run_dir, logging_dir, layout)
    same = same_pipeline(logging_dir, layout)
    if same:
        keep_recorded_paths(logging_dir, layout)
    resume = cfg.resume and not redo and same
    if not resume:
        rules = [] if same else rules_made_otherwise(cfg, sources, max_bytes, logging_dir,
                                                     text_field)
        clear_outputs(run_dir, keep_earlier=not same, earlier_rules=rules)
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
            check_not_empty(run_dir, layout, logging_dir, phases.index(phase) + 1)
    if previous is not None:
        previous.run()  # submits the whole chain of dependent jobs
    if not all(_finished(logging_dir, p) for p in phases):
        return {"status": "submitted", "executor": cfg.executor, "logging_dir": str(logging_dir)}
    summary = write_summary(run_dir, layout, logging_dir, started)
    if not summary["documents_out"]:
        yields = strict_json.loads((run_dir / YIELD_FILE).read_text(encoding="utf-8"))
        raise NoDocumentsError(no_documents_message(yields, summary["sources"], run_dir,
                                                      summary.get("skipped_examples", {}),
                                                      text_field))
    return summary


__all__ = [
    "ARXIV_STAGES", "DEFAULT_STAGES", "QUICKSTART_STAGES", "STAGES", "Phase", "PrepareConfig",
    "StageContext", "StagePlan", "StageSpec", "StageUnavailableError", "build_pipeline",
    "flow_stats", "make_executor", "register_stage", "resolve_factory", "run_prepare",
    "validate_prepare",
]
