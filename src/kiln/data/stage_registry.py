"""What a prepare stage is to the pipeline: the context its factory gets (StageContext),
what it returns (StagePlan: streaming steps, setup phases, a barrier), and the registry that
finds a stage's factory by name, importing it only when the stage is configured."""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.prepare_config import STAGES, PrepareConfig, StageSpec
from kiln.data.record_fields import DEFAULT_TEXT_FIELD
from kiln.data.skip_examples import EXAMPLES_DIR
from kiln.errors import ConfigError

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


def register_stage(name: str, target: str | Callable, reader: bool = False,
                   rules: str = "") -> None:
    """Add or replace a stage; `target` is "module:function" or the factory itself; `rules`
    "module:CONSTANT", the version of its rules where it keeps, drops or rewrites documents
    (`kiln.data.stage_rules`; none: a resumed prepare cannot tell its rules changed)."""
    if rules and not _WHERE.fullmatch(rules):  # else taken as a module at the prepare's start
        raise ValueError(
            f"register_stage('{name}', rules={rules!r}): rules names where the stage's version "
            f"is, 'module:CONSTANT' (as 'mypkg.stages:RULES_VERSION'), not the version itself")
    if callable(target):
        _FACTORIES[name] = target
        target = f"{target.__module__}:{target.__qualname__}"
    STAGES[name] = StageSpec(target, reader, rules)


_WHERE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # module:CONSTANT
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
