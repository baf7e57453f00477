"""Where a trainer picks its run up: the latest checkpoint every rank agrees on, loaded
whole and checked against the run's recorded settings, or, with none, the earlier outputs
that a new start must not mix with.

Why its own: resume is exact and refuses rather than guess (DESIGN: "Resume is exact");
these checks are one idea, apart from the step that trains. `Trainer` takes them in as a
base class: they read and set its state (step, tokens seen, loader position, callbacks').
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from kiln.config import recorded_config
from kiln.data.shards import INDEX
from kiln.errors import CheckpointError, KilnError, RunDataError, alike_on_every_rank
from kiln.export_recovery import stranded_exports
from kiln.hashing import file_sha256
from kiln.parallel.distributed import all_reduce_max
from kiln.parallel.rank_copies import ONE_COPY, copies_held
from kiln.parallel.rank_waits import run_on_every_rank
from kiln.train.checkpoint import (
    CHECKSUMS,
    check_checkpoint,
    load_checkpoint,
    missing_state,
    resume_told,
    unreadable,
)
from kiln.train.checkpoint_dirs import (
    checkpoint_step,
    latest_checkpoint,
    passed_over,
    pointed_name,
)
from kiln.train.earlier_outputs import unfinished_archive, unfinished_reason
from kiln.train.resume_settings import changed_since_recorded, refuse_changed_model


class Resuming:
    """The trainer's resume: `state_dict` is what a checkpoint saves of it."""

    def state_dict(self) -> dict[str, Any]:
        callbacks = {type(cb).__name__: cb.state_dict() for cb in self.callbacks}
        return {"step": self.step, "tokens_seen": self.tokens_seen,
                "elapsed_s": self.elapsed(), "loader": self.loader.state_dict(),
                "callbacks": {name: state for name, state in callbacks.items() if state}}

    def _maybe_resume(self) -> None:
        if self._go_on_with_a_start_cut_short():
            return
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        self._check_ranks_agree(ckpt)
        if ckpt is None:  # each rank looks at its own copy of the run: agreed, said once
            run_on_every_rank(self.env, self._refuse_mixing_with_earlier_outputs,
                              self._no_checkpoint_told, CheckpointError)
            return
        recorded = recorded_config(self.run_dir)
        with alike_on_every_rank():  # the settings and the checkpoint every rank agreed on
            refuse_changed_model(ckpt, recorded, self.cfg)
        # what may fail on some ranks alone (a node's own copy of the files, its token shards),
        # agreed before the collectives of loading, which the others would wait in
        state, copy = run_on_every_rank(self.env, lambda: self._read_resume_state(ckpt),
                                        lambda e: resume_told(e, ckpt), CheckpointError)
        self._refuse_other_copies(ckpt, copy)
        with alike_on_every_rank():  # the same checked bytes on every rank (rank 0's reading
            # of optimizer.pt, its alone, agreed with the others: `load_checkpoint`)
            state = load_checkpoint(ckpt, self.model, self.optimizer, state, self.env)
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self._elapsed_before = state["elapsed_s"]
        self._callback_states = state.get("callbacks", {})  # none in older checkpoints
        self._resumed_from = ckpt
        if self.env.is_main:
            print(f"resumed from {ckpt} at step {self.step}", file=sys.stderr)
            skipped = passed_over(ckpt.parent, ckpt)
            if skipped:  # the steps after this checkpoint are trained again
                print(f"note: {skipped}: resumed from {ckpt.name}, the newest complete one",
                      file=sys.stderr)
            if self.loader.resumed_on_counts:
                print(f"note: {ckpt} was saved on token shards whose contents were not hashed "
                      "(an older Kiln or index.json): these match it by their counts; their "
                      "contents cannot be compared (the next checkpoint records them)",
                      file=sys.stderr)
            changed = changed_since_recorded(recorded, self.cfg, self.step)
            if changed:
                print(f"note: resuming with settings changed since the run's config.toml was "
                      f"recorded: {'; '.join(changed)}", file=sys.stderr)
            if self.step >= self.cfg.train.steps:
                print(f"step {self.step} >= train.steps = {self.cfg.train.steps}: nothing to "
                      "train; raise train.steps to go on", file=sys.stderr)

    def _go_on_with_a_start_cut_short(self) -> bool:
        """A `--fresh` start (or a restart) killed while it moved the earlier model's outputs
        to archive/ is gone on with, not resumed from what it had not moved yet: that model
        was set aside when asked, and its outputs join the folder begun for them."""
        begun = unfinished_archive(self.run_dir)
        if begun is None:
            return False
        self._check_ranks_agree(None)  # as where there is no checkpoint: a rank that
        # found none of this meets the others in the same collective, and says so
        self._archive_earlier = unfinished_reason(begun)
        if self.env.is_main:
            print(f"note: an earlier start of this run from step 0 was cut short while it moved "
                  f"the earlier model's outputs to {begun}: the rest move there now, and "
                  "training starts at step 0", file=sys.stderr)
        return True

    def _read_resume_state(self, ckpt: Path) -> tuple[dict[str, Any], str | None]:
        """Checkpoint `ckpt`'s files checked and its trainer state read, the loader set to
        its position: this rank's part of a resume, without a collective. With it, the
        sha256 of the copy's checksums.json (None for a checkpoint from before them): what
        this copy is, compared across ranks (`_refuse_other_copies`)."""
        state = check_checkpoint(ckpt)
        missing_state(ckpt, state, ("step", "tokens_seen", "elapsed_s", "loader"))
        try:
            self.loader.load_state_dict(state["loader"])
        except (KeyError, TypeError, AttributeError) as e:  # not a loader's state: altered
            raise unreadable(ckpt, e, "trainer.pt") from e
        except ValueError as e:
            raise CheckpointError(f"cannot resume from {ckpt}: {e}; the token shards, "
                                  "train.seq_len or run.seed changed since it was saved; use "
                                  "the run's config, or `kiln train --fresh`") from e
        sums = ckpt / CHECKSUMS
        try:
            return state, file_sha256(sums) if sums.is_file() else None
        except OSError as e:
            raise unreadable(ckpt, e, CHECKSUMS) from e

    def _refuse_other_copies(self, ckpt: Path, copy: str | None) -> None:
        """Ranks reading their own copies of the run (a node's own disk) may hold different
        checkpoints of one step, each valid (one copy stale, or from another run): each rank
        would load its own weights, and FSDP's shards or DDP's replicas would mix two states
        silently. The copies' checksums.json must be the same on every rank."""
        held = copies_held(self.env, copy)
        if held is None:
            return
        with alike_on_every_rank():  # every rank gathered the same copies
            raise CheckpointError(
                f"the ranks hold different copies of checkpoint {ckpt.name} (their {CHECKSUMS} "
                f"differ: {held}; rank {self.env.rank}'s is {ckpt}): {ONE_COPY}")

    def _refuse_other_shards(self) -> None:
        """Ranks reading their own copies of the run may hold other token shards (one node's
        re-made since): each rank would take its slice of a step from its own data, windows
        of one copy's order cut from the other's, silently. A resume would refuse the odd
        copy against its checkpoint's loader state, but a new run has none."""
        held = copies_held(self.env, self.loader.stream.fingerprint)
        if held is None:
            return
        with alike_on_every_rank():  # every rank gathered the same fingerprints
            raise RunDataError(
                f"the ranks hold different token shards (their {self.token_dir / INDEX} "
                f"differ: {held}): {ONE_COPY}")

    def _refuse_mixing_with_earlier_outputs(self) -> None:
        """No checkpoint to resume from, yet a run trained here. A run stopped before its
        first checkpoint (or whose checkpoints were moved away) starts again at step 0 with
        its earlier outputs archived, not appended to: its report would mix two runs. A
        `latest` pointer naming a checkpoint that is gone, or a finished model's outputs
        (eval, samples, export) without its checkpoints, are refused: those were
        trained steps, and training them again is not a default."""
        pointer = self.run_dir / "checkpoints" / "latest"
        if pointer.exists():
            named = pointed_name(pointer)
            raise CheckpointError(
                f"{pointer} {f'names {named!r}' if named else 'is damaged'}, but no complete checkpoint "
                "is left to resume from: put the checkpoints back, or start over with "
                "`kiln train --fresh` (which moves the old outputs to archive/)")
        metrics = self.run_dir / "metrics.jsonl"
        if not (metrics.is_file() and metrics.stat().st_size > 0):
            return
        # (not report.html alone: `kiln run` writes one for a run that diverged early)
        made = [name for name in ("eval.json", "samples.json", "export")
                if (self.run_dir / name).exists()]
        if "export" not in made and stranded_exports(self.run_dir / "export"):
            made.append("export (moved aside by an export that was killed)")
        if made:  # a finished model whose checkpoints were deleted: retraining is not a default
            raise CheckpointError(
                f"{self.run_dir} holds a trained model's outputs ({', '.join(made)}) but no "
                "checkpoint to resume from: put the checkpoints back, or train a new model "
                "with `kiln train --fresh` (which moves the old outputs to archive/)")
        self._archive_earlier = "restart"
        if self.env.is_main:
            print(f"note: {metrics} holds an earlier run's records but there is no checkpoint "
                  "to resume from: training starts at step 0, and the earlier outputs move to "
                  "archive/", file=sys.stderr)

    def _no_checkpoint_told(self, e: BaseException) -> str:
        """How a rank's failure in `_refuse_mixing_with_earlier_outputs` is told, after "rank R"."""
        if isinstance(e, KilnError):
            return f"could not resume: {e}"
        how = "was interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        return (f"{how} as it looked at the earlier outputs in {self.run_dir} "
                f"({type(e).__name__}{f': {e}' if str(e) else ''})")

    def _check_ranks_agree(self, ckpt: Path | None) -> None:
        """Every rank must resume from the same checkpoint (on several nodes, the run
        directory must be one shared folder); a mismatch would hang or mix two states."""
        if not self.env.distributed:
            return
        name = -1 if ckpt is None else checkpoint_step(ckpt)
        found = torch.tensor([name, -name], device=self.device)
        high, neg_low = all_reduce_max(found, self.env).tolist()
        if high != -neg_low:
            def said(step: int) -> str:
                return "no checkpoint" if step < 0 else f"step {step}"
            raise CheckpointError(
                f"the ranks found different checkpoints to resume from in "
                f"{self.run_dir / 'checkpoints'} ({said(-neg_low)} to {said(high)}; rank "
                f"{self.env.rank}: {said(name)}): every rank must read the same run directory "
                "(one shared filesystem across nodes)")
