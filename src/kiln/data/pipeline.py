"""`kiln prepare` as a configurable chain of datatrove steps: stage registry, builder, runner.

A stage is named in `prepare.stages` and built by a factory `factory(ctx: StageContext)` that
returns one PipelineStep or a list of them. Factories live in the stage's own module and are
imported only when the stage is configured, so a pipeline that does not use a stage never needs
its dependencies, and one that does gets an error naming the stage and the missing module.
After every stage the builder inserts a `YieldMeter`, from which `yield.json` is computed.

The same step list runs under datatrove's local, Slurm or Ray executor. Input files are sharded
by task (file i goes to task i % tasks); every task writes documents/NNNNN.jsonl.gz. A re-run of
the same pipeline (same stages, sources and task count) skips the tasks already completed;
`redo=True` (or any change to the pipeline) starts from scratch.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from kiln.atomic import write_json_atomic
from kiln.data.yield_report import LAYOUT_FILE, YieldMeter, merge_task_stats, write_yield_report

EXECUTORS = ("local", "slurm", "ray")
QUICKSTART_STAGES = ["read", "dedup_exact", "quality", "pii", "decontaminate", "write"]
ARXIV_STAGES = [
    "arxiv_metadata", "arxiv_sources", "latex", "dedup_exact", "quality", "pii",
    "decontaminate", "write",
]


@dataclass
class PrepareConfig:
    # ordered stage names (see STAGES); the first reads documents, the last is "write"
    stages: list[str] = field(default_factory=lambda: ["read", "write"])
    executor: str = "local"  # local | slurm | ray
    tasks: int = 1  # shards of the input files; each task writes one documents file
    workers: int = 1  # local: tasks run at the same time
    resume: bool = True  # skip tasks a previous run of the same pipeline completed
    keep_rejected: bool = False  # filters write dropped documents to rejected/<stage>/
    slurm_partition: str = ""
    slurm_time: str = "04:00:00"
    cpus_per_task: int = 1  # slurm / ray
    mem_per_cpu_gb: int = 2  # slurm / ray


@dataclass(frozen=True)
class StageSpec:
    """Where a stage's factory lives ("module:function") and whether it reads documents in."""

    target: str
    reader: bool = False


STAGES: dict[str, StageSpec] = {
    "read": StageSpec("kiln.data.pipeline:read_stage", reader=True),
    "arxiv_metadata": StageSpec("kiln.data.arxiv.metadata:metadata_stage", reader=True),
    "arxiv_sources": StageSpec("kiln.data.arxiv.source_reader:sources_stage"),
    "latex": StageSpec("kiln.data.arxiv.latex_source:latex_stage"),
    "quality": StageSpec("kiln.data.filters.quality:quality_stage"),
    "brain_rot_m1": StageSpec("kiln.data.filters.engagement:brain_rot_m1_stage"),
    "brain_rot_m2": StageSpec("kiln.data.filters.judge:brain_rot_m2_stage"),
    "perplexity": StageSpec("kiln.data.filters.selection:perplexity_stage"),
    "pii": StageSpec("kiln.data.pii.step:pii_stage"),
    "decontaminate": StageSpec("kiln.data.decontam.filter:decontaminate_stage"),
    "dedup_exact": StageSpec("kiln.data.dedup:dedup_exact_stage"),
    "dedup_minhash": StageSpec("kiln.data.dedup:dedup_minhash_stage"),
    "dating": StageSpec("kiln.data.dating:dating_stage"),
    "period": StageSpec("kiln.data.dating:period_stage"),
    "write": StageSpec("kiln.data.pipeline:write_stage"),
}


def _config_error(message: str) -> Exception:
    """kiln.config.ConfigError, imported late: config.py imports PrepareConfig from here."""
    from kiln.config import ConfigError

    return ConfigError(message)


class StageUnavailableError(ImportError):
    """A configured stage whose module (or factory, or a dependency of it) cannot be imported."""


@dataclass
class StageContext:
    """What a stage factory may use: the config, the run directory and the sources."""

    name: str
    cfg: PrepareConfig
    run_dir: Path
    sources: list[str]
    max_bytes: int = 0
    progress: bool = True

    def exclusion_writer(self):
        """A JsonlWriter for this stage's dropped documents if prepare.keep_rejected, else None."""
        if not self.cfg.keep_rejected:
            return None
        from datatrove.pipeline.writers import JsonlWriter

        return JsonlWriter(str(self.run_dir / "rejected" / self.name))


def register_stage(name: str, target: str | Callable, reader: bool = False) -> None:
    """Add or replace a stage; `target` is "module:function" or the factory itself."""
    if callable(target):
        _FACTORIES[name] = target
        target = f"{target.__module__}:{target.__qualname__}"
    STAGES[name] = StageSpec(target, reader)


_FACTORIES: dict[str, Callable] = {}  # factories registered as objects (not importable paths)


def read_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.documents import SourceReader

    return SourceReader(ctx.sources, max_bytes=ctx.max_bytes, progress=ctx.progress)


def write_stage(ctx: StageContext) -> PipelineStep:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(ctx.run_dir / "documents"))


def resolve_factory(name: str) -> Callable[[StageContext], PipelineStep | Sequence[PipelineStep]]:
    """Import the stage's factory now, or raise StageUnavailableError naming what is missing."""
    if name not in STAGES:
        close = difflib.get_close_matches(name, list(STAGES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise _config_error(f"prepare.stages: unknown stage '{name}'{hint}; known: {sorted(STAGES)}")
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


def validate_prepare(cfg: PrepareConfig) -> PrepareConfig:
    """Reject impossible prepare configs, naming the key (called by config validation)."""
    if not cfg.stages:
        raise _config_error("prepare.stages is empty; the shortest pipeline is [\"read\", \"write\"]")
    for name in cfg.stages:
        if name not in STAGES:
            resolve_factory(name)  # raises the unknown-stage ConfigError
    if not STAGES[cfg.stages[0]].reader:
        readers = sorted(n for n, s in STAGES.items() if s.reader)
        raise _config_error(f"prepare.stages must start with a reader stage {readers}, "
                          f"not '{cfg.stages[0]}'")
    if cfg.stages[-1] != "write" or cfg.stages.count("write") != 1:
        raise _config_error("prepare.stages must end with 'write' (and name it once)")
    dupes = sorted({n for n in cfg.stages if cfg.stages.count(n) > 1})
    if dupes:
        raise _config_error(f"prepare.stages names {dupes} more than once")
    if cfg.executor not in EXECUTORS:
        raise _config_error(f"prepare.executor: '{cfg.executor}' is not one of {list(EXECUTORS)}")
    for key in ("tasks", "workers", "cpus_per_task", "mem_per_cpu_gb"):
        if getattr(cfg, key) < 1:
            raise _config_error(f"prepare.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.executor == "slurm" and not cfg.slurm_partition:
        raise _config_error("prepare.executor = 'slurm' needs prepare.slurm_partition")
    return cfg


def build_pipeline(
    cfg: PrepareConfig,
    run_dir: Path | str,
    sources: Sequence[str] = (),
    max_bytes: int = 0,
    progress: bool = True,
) -> tuple[list[PipelineStep], dict]:
    """The steps of every configured stage, each followed by a YieldMeter; plus their layout.

    The layout (stage of every step, which are meters, which stages read) is what the yield
    report needs to attribute the per-step stats.
    """
    validate_prepare(cfg)
    run_dir = Path(run_dir)
    steps: list[PipelineStep] = []
    roles: list[dict] = []
    for name in cfg.stages:
        factory = resolve_factory(name)
        ctx = StageContext(name, cfg, run_dir, list(sources), max_bytes, progress)
        made = factory(ctx)
        made = list(made) if isinstance(made, (list, tuple)) else [made]
        for step in made:
            if hasattr(step, "pipeline") and hasattr(step, "tasks"):
                raise NotImplementedError(
                    f"prepare stage '{name}' is multi-pass (it returned executor stages such as "
                    f"{getattr(step, 'name', step)!r}); pipeline barriers between executors are "
                    "not implemented yet: run it with its own runner"
                )
            if not isinstance(step, PipelineStep):
                raise TypeError(f"prepare stage '{name}' returned {step!r}, not a PipelineStep")
            steps.append(step)
            roles.append({"stage": name, "meter": False, "step": str(step)})
        steps.append(YieldMeter(name))
        roles.append({"stage": name, "meter": True, "step": str(steps[-1])})
    layout = {
        "steps": roles,
        "readers": [n for n in cfg.stages if STAGES[n].reader],
        "tasks": cfg.tasks,
        "signature": {
            "stages": list(cfg.stages), "tasks": cfg.tasks, "sources": list(sources),
            "max_bytes": max_bytes, "keep_rejected": cfg.keep_rejected,
        },
    }
    return steps, layout


def make_executor(cfg: PrepareConfig, steps: list[PipelineStep], logging_dir: Path,
                  skip_completed: bool):
    """The datatrove executor named by prepare.executor, with a clear error if it can't run."""
    common = {"tasks": cfg.tasks, "logging_dir": str(logging_dir), "skip_completed": skip_completed}
    if cfg.executor == "local":
        from datatrove.executor import LocalPipelineExecutor

        return LocalPipelineExecutor(steps, workers=cfg.workers, **common)
    if cfg.executor == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        if shutil.which("sbatch") is None:
            raise RuntimeError("prepare.executor = 'slurm' but `sbatch` is not on PATH")
        return SlurmPipelineExecutor(
            steps, time=cfg.slurm_time, partition=cfg.slurm_partition, workers=cfg.workers,
            cpus_per_task=cfg.cpus_per_task, mem_per_cpu_gb=cfg.mem_per_cpu_gb,
            job_name="kiln_prepare", **common)
    if cfg.executor == "ray":
        if importlib.util.find_spec("ray") is None:
            raise RuntimeError("prepare.executor = 'ray' needs the `ray` package (pip install ray)")
        from datatrove.executor import RayPipelineExecutor

        return RayPipelineExecutor(steps, workers=cfg.workers, cpus_per_task=cfg.cpus_per_task,
                                   mem_per_cpu_gb=cfg.mem_per_cpu_gb, **common)
    raise _config_error(f"prepare.executor: '{cfg.executor}' is not one of {list(EXECUTORS)}")


def _same_pipeline(logging_dir: Path, layout: dict) -> bool:
    path = logging_dir / LAYOUT_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return saved.get("signature") == layout["signature"] and saved.get("steps") == layout["steps"]


def _clear_outputs(run_dir: Path) -> None:
    for name in ("prepare.json", "yield.json"):
        (run_dir / name).unlink(missing_ok=True)
    for folder in ("documents", "rejected", "logs/prepare"):
        shutil.rmtree(run_dir / folder, ignore_errors=True)


def _summary(run_dir: Path, layout: dict, logging_dir: Path) -> dict:
    """prepare.json: the reader's documents/bytes/skips (keys kept from the read-only era)."""
    merged = merge_task_stats(logging_dir, layout["tasks"])
    sig = layout["signature"]
    read = {"documents": 0, "bytes": 0}
    skipped: dict[str, int] = {}
    for role, step in zip(layout["steps"], merged, strict=True):
        if role["stage"] in layout["readers"] and not role["meter"]:
            counts = step["counts"]
            read["documents"] += int(counts.get("documents", 0))
            read["bytes"] += int(counts.get("bytes", 0))
            for key, value in counts.items():
                if key.startswith("skipped/"):
                    skipped[key.split("/", 1)[1]] = skipped.get(key.split("/", 1)[1], 0) + int(value)
    yields = write_yield_report(run_dir, logging_dir)
    summary = {
        "sources": sig["sources"] or ["<stdlib>"],
        "max_bytes": sig["max_bytes"],
        **read,
        "skipped": dict(sorted(skipped.items())),
        "stages": list(sig["stages"]),
        "tasks": layout["tasks"],
        "documents_out": yields["documents_out"],
        "bytes_out": yields["bytes_out"],
    }
    write_json_atomic(run_dir / "prepare.json", summary)
    return summary


def run_prepare(
    cfg: PrepareConfig,
    run_dir: Path | str,
    sources: Sequence[str] = (),
    max_bytes: int = 0,
    redo: bool = False,
    progress: bool = True,
) -> dict:
    """Build and run the prepare pipeline; write prepare.json and yield.json; return the summary.

    `max_bytes` caps each task's reader. With the Slurm executor the jobs are only submitted:
    the summary says so, and `kiln.data.yield_report.write_yield_report(run_dir)` gives the
    yield once they finish.
    """
    run_dir = Path(run_dir)
    steps, layout = build_pipeline(cfg, run_dir, sources, max_bytes, progress)
    logging_dir = run_dir / "logs" / "prepare"
    resume = cfg.resume and not redo and _same_pipeline(logging_dir, layout)
    if not resume:
        _clear_outputs(run_dir)
    else:
        for name in ("prepare.json", "yield.json"):
            (run_dir / name).unlink(missing_ok=True)
    executor = make_executor(cfg, steps, logging_dir, skip_completed=resume)
    write_json_atomic(logging_dir / LAYOUT_FILE, layout)
    executor.run()
    stats_dir = logging_dir / "stats"
    if not all((stats_dir / f"{r:05d}.json").is_file() for r in range(cfg.tasks)):
        return {"status": "submitted", "executor": cfg.executor, "logging_dir": str(logging_dir)}
    return _summary(run_dir, layout, logging_dir)

