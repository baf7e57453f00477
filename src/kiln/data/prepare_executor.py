"""The datatrove executor a prepare phase runs under (local, Slurm or Ray, by
prepare.executor), with a clear error where the chosen one cannot run here."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from datatrove.pipeline.base import PipelineStep

from kiln.data.prepare_config import EXECUTORS, PrepareConfig
from kiln.errors import ConfigError

if TYPE_CHECKING:  # the executors are imported when one is made
    from datatrove.executor.base import PipelineExecutor


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
