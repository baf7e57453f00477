"""What a trainer writes in its run directory besides checkpoints: metrics.jsonl records,
config.toml / env.json / model.json (with how each stretch of a resumed run launched),
a resume's records past its checkpoint set aside, an earlier model's outputs archived.

Why its own: every write here fails as a checkpoint write does (one line naming the run,
nothing lost), and none of it is the train step. `Trainer` takes it in as a base class.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kiln import strict_json
from kiln.atomic import write_json_atomic
from kiln.errors import CheckpointError
from kiln.run_dir import write_run_metadata
from kiln.train.callbacks import append_jsonl
from kiln.train.checkpoint import archive_checkpoints, cannot_write
from kiln.train.earlier_outputs import drop_earlier_records
from kiln.train.metrics_tail import set_aside_records_after


class RunRecords:
    """The trainer's records in its run directory."""

    def log(self, record: dict[str, Any]) -> None:
        if self.env.is_main:
            path = self.run_dir / "metrics.jsonl"
            try:
                append_jsonl(path, record)
            except OSError as e:
                raise cannot_write(self.run_dir / "checkpoints", str(path), e) from e

    def _launches(self, how: dict[str, Any]) -> list[dict[str, Any]]:
        """How each stretch of a resumed run trained, from the step it started at: a run
        resumed on another number of ranks (or precision) says so, not only how it ended."""
        here = {"from_step": self.step + 1, **how}
        if self.step == 0:
            return [here]
        try:
            old = strict_json.loads((self.run_dir / "model.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return [here]
        if not isinstance(old, dict):  # damaged (by hand): its history is lost, not the run
            return [here]
        # only launches as Kiln wrote them: a damaged entry (not a table, a step not a
        # number) stopped the resume with a traceback
        launches = old.get("launches")
        earlier = [e for e in launches if isinstance(e, dict)
                   and type(e.get("from_step", 1)) is int] if isinstance(launches, list) else []
        earlier = earlier or [{"from_step": 1, **{k: old.get(k) for k in how}}]
        # a launch stopped before its first checkpoint left no steps: this one replaces it
        earlier = [e for e in earlier if e.get("from_step", 1) < here["from_step"]] or earlier[:1]
        same = {k: v for k, v in earlier[-1].items() if k != "from_step"} == how
        return earlier if same else [*earlier, here]

    def _set_aside_later_records(self) -> None:
        """A resumed run's metrics.jsonl ends at its checkpoint: what an earlier stretch logged
        after it (steps trained again now) moves to archive/, so the report shows one run."""
        if not (self.env.is_main and self._resumed_from is not None):
            return
        try:
            moved = set_aside_records_after(self.run_dir, self.step)
        except OSError as e:
            raise cannot_write(self.run_dir / "checkpoints", "metrics.jsonl", e) from e
        if moved:  # through tqdm: the progress bar may be drawn already
            tqdm.write(f"note: the records an earlier stretch logged after step {self.step} "
                       f"(past its last checkpoint) moved to {moved}", file=sys.stderr)

    def _write_metadata(self) -> None:
        """config.toml (with git hash and versions) and model.json: what this run trains.
        config.toml keeps model.vocab_size as it was given (0: the tokenizer's; model.json
        has the count): a recorded 4096 would hold the run to it after its data is re-made
        with another tokenizer (a larger one refused, a smaller one padded silently)."""
        given = dataclasses.replace(self.model_cfg, vocab_size=self.given_vocab)
        how = {"precision": self.precision, "world_size": self.env.world_size,
               "accum_steps": self.accum_steps,
               "parallel": self.cfg.train.parallel if self.env.distributed else "none"}
        launches = self._launches(how)
        try:  # a full disk here is the one-line error a checkpoint write gives, not a traceback
            write_run_metadata(dataclasses.replace(self.cfg, model=given),
                               f"{self.device.type} ({self.precision})")
            write_json_atomic(self.run_dir / "model.json", {
                **self.figures, **how, **({"launches": launches} if len(launches) > 1 else {})})
            drop_earlier_records(self.run_dir)  # the archive (if any) took them before
        except OSError as e:
            raise cannot_write(self.run_dir / "checkpoints",
                               "the run's config.toml, env.json and model.json", e) from e

    def _archive_earlier_outputs(self) -> Path | None:
        """Move the earlier model's outputs to archive/: a disk that cannot take the folder
        (full, read-only) is the one-line error a checkpoint write gives, not a traceback;
        nothing has trained, and what did not move stays where it was."""
        try:
            return archive_checkpoints(self.run_dir, self._archive_earlier)
        except OSError as e:
            again = "`kiln train --fresh`" if self._archive_earlier == "fresh" else "`kiln train`"
            raise CheckpointError(
                f"cannot move the earlier model's outputs to {self.run_dir / 'archive'} "
                f"({type(e).__name__}: {e}): is the disk full or read-only? nothing was "
                f"trained; free space and run {again} again") from e
