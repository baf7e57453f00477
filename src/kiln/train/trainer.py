"""The training loop. `train_step` reads top to bottom; everything else is a callback.

The checks before a model is built live in `train_setup`, the resume in `resuming`, and
what the trainer writes in its run directory in `run_records`."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.config import Config, flat_settings
from kiln.data.loader import TokenLoader, masking_eos_id
from kiln.data.provenance import check_tokens_current
from kiln.errors import (
    CheckpointError,
    ConfigError,
    KilnError,
    RunDataError,
    TrainingDiverged,
    TrainingInterrupted,
    alike_on_every_rank,
    marked_alike,
)
from kiln.model import Transformer, count_params, flops_per_token
from kiln.model.balancing import max_violation
from kiln.model.doc_mask import document_ids
from kiln.optim import build_optimizer
from kiln.parallel.distributed import (
    all_reduce_mean,
    all_reduce_sum,
    init_distributed,
    local_device,
)
from kiln.parallel.meta_init import build_on_meta
from kiln.parallel.model_wrapping import grad_sync, parallelize
from kiln.parallel.rank_waits import run_on_every_rank, run_on_main
from kiln.train.callbacks import Callback, default_callbacks
from kiln.train.checkpoint import (
    check_writable,
    clear_killed_writes,
    prune_checkpoints,
    resume_told,
    unreadable,
)
from kiln.train.checkpoint_dirs import complete_checkpoints
from kiln.train.checkpoint_room import no_room_note
from kiln.train.divergence_advice import divergence_advice
from kiln.train.host_memory import keep_freed_memory
from kiln.train.memory_fit import check_training_fits
from kiln.train.precision import autocast, resolve_device, resolve_precision
from kiln.train.resuming import Resuming
from kiln.train.run_records import RunRecords
from kiln.train.schedule import lr_multiplier
from kiln.train.train_setup import (
    check_data_and_design,
    check_splits,
    fit_micro_batch,
    model_config_for_run,
    note_data_use,
    note_settings,
)


def _told_by_rank_zero(e: BaseException) -> str:
    """Rank 0's failure in its own part of the start (`Trainer._on_main`), as the other
    ranks raise it: a Kiln error's own line."""
    if isinstance(e, KilnError):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return f"rank 0 was interrupted before training started ({type(e).__name__})"
    return f"rank 0 failed before training started ({type(e).__name__}: {e})"


def _not_fitted(e: BaseException) -> str:
    """A rank's failure in `check_training_fits`, as every rank raises it after "rank R"."""
    if isinstance(e, KilnError):
        return f"cannot train here: {e}"
    if isinstance(e, KeyboardInterrupt):
        return "was interrupted before training started"
    return f"failed before training started ({type(e).__name__}: {e})"


def _data_refused(e: BaseException) -> str:
    """A rank's failure to open the run's data, as every rank raises it after "rank R"."""
    if isinstance(e, KilnError):
        return f"cannot train on its data: {e}"
    if isinstance(e, KeyboardInterrupt):
        return "was interrupted while it checked the run's data"
    return f"could not open the run's data ({type(e).__name__}: {e})"


class Trainer(Resuming, RunRecords):
    """One run's training: built from its config and run directory (resumed where a checkpoint
    is), then `fit` runs `train_step` to train.steps with the callbacks around it."""

    def __init__(self, cfg: Config, callbacks: list[Callback] | None = None, resume: bool = True):
        self.cfg, self.run_dir = cfg, cfg.run_dir
        self.token_dir = self.run_dir / "tokens"
        t = cfg.train
        self.device = resolve_device(t.device)
        self.env = init_distributed(self.device, flat_settings(cfg))
        self.device = local_device(self.device, self.env)
        self.precision = resolve_precision(t.precision, self.device)
        if self.device.type == "cpu" and t.keep_host_memory:
            keep_freed_memory()
        with alike_on_every_rank():  # the settings alone
            self.micro_batch = fit_micro_batch(t.global_batch, t.micro_batch, self.env.world_size)
        note_settings(cfg, self.env, self.device, self.micro_batch)
        self.accum_steps = t.global_batch // self.env.world_size // self.micro_batch

        torch.manual_seed(cfg.run.seed)
        with alike_on_every_rank():  # the run's shards and the settings: said once, not per rank
            self.model_cfg = model_config_for_run(cfg, self.token_dir)
        self.given_vocab = cfg.model.vocab_size  # 0: the tokenizer's, recorded so
        self.cfg = dataclasses.replace(cfg, model=self.model_cfg)
        # each rank's own device (a CPU rank: its host) has its own free memory: agreed, so
        # every rank says why, not only the short one (the others met a lost rank at the
        # model's first collective)
        run_on_every_rank(self.env, lambda: check_training_fits(
            self.model_cfg, cfg.optim.name, self.device, t.parallel, self.env.world_size,
            # eager activations only: torch.compile's partitioner may recompute what eager saves
            tokens=0 if t.compile else self.micro_batch * t.seq_len, precision=self.precision),
            _not_fitted, ConfigError)
        # weights on the meta device: `parallelize` makes them where they train (a device,
        # FSDP2 shards), drawn as a CPU build draws them, one parameter at a time
        raw, init = build_on_meta(lambda: Transformer(self.model_cfg))
        self.raw_model = raw
        self.figures = {**count_params(raw),
                        "flops_per_token": flops_per_token(self.model_cfg, t.seq_len)}
        self.model = parallelize(raw, t.parallel, self.env, compile=t.compile,
                                 device=self.device, init=init)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        # each rank hashes the shards it opens (minutes, on a copy not checked yet; a node's
        # own copy may be damaged): agreed in a polled wait, so a rank done first still takes
        # SIGTERM (it sat deaf in the gather of `_refuse_other_shards`) and every rank says
        # why one rank's data was refused
        run_on_every_rank(self.env, self._open_data, _data_refused, RunDataError)
        note_data_use(self.loader, self.token_dir, t, self.env.is_main)
        self._refuse_other_shards()  # a node's own copy of the run: the same data on every rank
        self.callbacks = default_callbacks() if callbacks is None else callbacks
        self.step, self.tokens_seen, self._elapsed_before = 0, 0, 0.0
        self._callback_states: dict[str, dict[str, Any]] = {}
        self._resumed_from: Path | None = None
        self.told_no_room = False  # said (at the resume or a save): the disk cannot take the next save
        self._start = time.perf_counter()
        # outputs of an earlier run with no checkpoint to continue from: --fresh, or a run
        # stopped before its first checkpoint (or whose checkpoints were moved away)
        self._archive_earlier = None if resume else "fresh"  # why earlier outputs move aside
        if resume:
            self._maybe_resume()
        check_data_and_design(cfg, self.model_cfg, self.run_dir, self.step, self.env.is_main)

    def _open_data(self) -> None:
        """This rank's checks of the run's data and its loader (the shards hashed where their
        stat changed), without a collective."""
        t = self.cfg.train
        check_tokens_current(self.run_dir)  # not made from documents or a tokenizer since replaced
        check_splits(self.token_dir, t.seq_len)  # before training, not at its end
        self.eos_id = masking_eos_id(self.token_dir, self.model_cfg.doc_mask)  # None: no mask
        self.loader = TokenLoader(self.token_dir, "train", t.seq_len, t.global_batch,
                                  self.cfg.run.seed, self.env.rank, self.env.world_size)

    # -- divergence ---------------------------------------------------------------------

    def _stop_if_diverged(self, record: dict[str, Any]) -> None:
        """A non-finite loss or gradient norm has poisoned the weights (the update already
        ran): stop before any callback logs or checkpoints them, so the checkpoints on disk
        stay finite and `keep_checkpoints` never rotates the good ones out."""
        aux = record.get("aux_loss", 0.0)
        if math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"]) and \
                math.isfinite(aux):
            return
        said = f", MoE auxiliary loss {aux}" if "aux_loss" in record else ""
        raise self.diverged(f"loss {record['loss']}, gradient norm {record['grad_norm']}{said}")

    def diverged(self, what: str) -> TrainingDiverged:
        """The error for a run that diverged at this step, saying which checkpoint to go on
        from. The newest may already hold weights on their way to blowing up (finite, but
        huge): if resuming from it diverges again at once, an older one is named."""
        done = complete_checkpoints(self.run_dir / "checkpoints")
        # the run dir's config.toml now records these settings, and a run dir trains with its
        # recorded ones: a plain re-run would diverge the same way
        lower = divergence_advice(self.cfg.optim)
        if not done:
            since = f"no checkpoint was written yet: {lower}, and start again"
        else:
            since = (f"the last checkpoint, {done[-1].name}, is from before it: {lower}, and "
                     "run `kiln train` again to resume from there")
            if len(done) > 1:
                since += (f"; if that diverges again at once, move {done[-1].name} out of "
                          f"checkpoints/ to resume from {done[-2].name}")
        self._log_divergence(what)
        # met alike: what it is found on (the ranks' loss, the global norm, every rank's
        # weights) is agreed, so every rank stops at this step: said once per node
        return marked_alike(
            TrainingDiverged(f"training diverged at step {self.step}: {what}; {since}"))

    def _log_divergence(self, what: str) -> None:
        """A `diverged` record in metrics.jsonl (no figures: nothing poisoned is logged), so
        the run's report says it diverged, where its last logged step alone reads as a run
        killed before its next checkpoint. A resume moves it to archive/ with the steps
        after its checkpoint."""
        try:
            self.log({"kind": "diverged", "step": self.step, "what": what})
        except CheckpointError:  # a disk that cannot take it: the divergence is the error
            pass

    def elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._start

    # -- the step ------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        batch = self.loader.next_batch().to(self.device)
        lr = self.cfg.optim.lr * lr_multiplier(self.step, self.cfg.train.steps, self.cfg.schedule)
        for group in self.optimizer.param_groups:  # Muon groups keep their lr ratio
            group["lr"] = lr * group.get("lr_scale", 1.0)

        loss_sum = torch.zeros((), device=self.device)
        aux_sum = None  # the MoE balance / z-losses added to the objective, if any
        micro_batches = batch.split(self.micro_batch)
        for i, micro in enumerate(micro_batches):
            inputs, targets = micro[:, :-1], micro[:, 1:]
            docs = None if self.eos_id is None else document_ids(inputs, self.eos_id)
            with grad_sync(self.model, i == len(micro_batches) - 1):
                with autocast(self.device, self.precision):
                    masked = {} if docs is None else {"doc_ids": docs}  # off: the plain call
                    loss = self.model(inputs, targets=targets, **masked)
                aux = self.raw_model.aux_loss()  # MoE balance / z-losses, if any
                objective = loss if aux is None else loss + aux
                (objective / len(micro_batches)).backward()
            loss_sum += loss.detach()
            if aux is not None:
                aux_sum = aux.detach().float() + (0 if aux_sum is None else aux_sum)

        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        moe = self.raw_model.moe_layers()
        # one balancing step per optimizer step, from counts summed over micro-batches and ranks
        step_counts = [layer.update_bias(lambda c: all_reduce_sum(c, self.env)) for layer in moe]

        self.step += 1
        step_tokens = batch.shape[0] * (batch.shape[1] - 1) * self.env.world_size
        self.tokens_seen += step_tokens
        loss = all_reduce_mean(loss_sum / len(micro_batches), self.env)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        figures = [loss.float(), grad_norm.float()]
        if aux_sum is not None:  # logged: a divergence may start in it, not in the loss
            figures.append(all_reduce_mean(aux_sum / len(micro_batches), self.env).float())
        # one device-to-host read for the figures: each read waits for the GPU to finish
        loss_value, norm_value, *aux_value = torch.stack(figures).tolist()
        record = {"loss": loss_value, "lr": lr, "grad_norm": norm_value,
                  "step_tokens": step_tokens, **({"aux_loss": aux_value[0]} if aux_value else {})}
        if moe:
            record["moe_max_vio"] = [max_violation(c) for c in step_counts]  # the global step's load
            record["moe_load"] = [(c.double() / max(1, int(c.sum()))).tolist() for c in step_counts]
        return record

    def _on_main(self, work: Callable[[], None]) -> None:
        """`work` (on the run's files) on rank 0 alone, the other ranks told how it went: a
        disk that refuses rank 0's writes stops every rank with its error, said once, where
        the others met a lost rank at their first step (or, with nothing to train, exited 0)."""
        run_on_main(self.env, work, _told_by_rank_zero, CheckpointError)

    def _leave_as_is(self) -> None:
        """Nothing to train: but for the records past its checkpoint, and what a kill in its
        last save left (no later save clears or prunes it)."""
        self._set_aside_later_records()
        clear_killed_writes(self.run_dir / "checkpoints")
        prune_checkpoints(self.run_dir / "checkpoints", self.cfg.train.keep_checkpoints)

    def _make_way(self) -> None:
        """Before anything is written or trained: the earlier model's outputs moved aside
        (kept, but out of the new run's way), the checkpoints folder found writable, and
        pruned to keep_checkpoints (a kill before a save's pruning left one more)."""
        if self._archive_earlier:
            moved = self._archive_earlier_outputs()
            if moved:
                print(f"the earlier model's checkpoints, metrics and outputs moved to {moved}",
                      file=sys.stderr)
        check_writable(self.run_dir / "checkpoints")
        # the resumed checkpoint is loaded: the kept set made what the settings say
        clear_killed_writes(self.run_dir / "checkpoints")
        prune_checkpoints(self.run_dir / "checkpoints", self.cfg.train.keep_checkpoints)
        note = no_room_note(self._resumed_from) if self._resumed_from is not None else ""
        if note:  # before training: the first save would fail
            print(note, file=sys.stderr)
            self.told_no_room = True

    def _record_the_start(self) -> None:
        self._set_aside_later_records()
        self._write_metadata()

    def fit(self) -> list[float]:
        """Train to `train.steps`; returns the losses of the steps run here."""
        self._start = time.perf_counter()
        if self.step >= self.cfg.train.steps:  # nothing to train: leave the run as it is
            self._on_main(self._leave_as_is)
            return []
        self._on_main(self._make_way)
        losses, started = [], []
        try:
            for cb in self.callbacks:
                cb.on_train_start(self)
                started.append(cb)
            if self._callback_states:  # trainer.pt's, read alike: agreed, so said once
                run_on_every_rank(self.env, self._load_callback_states,
                                  lambda e: resume_told(e, self._resumed_from), CheckpointError)
            # once the checkpoint has loaded whole: a refused one changes nothing
            self._on_main(self._record_the_start)
            while self.step < self.cfg.train.steps:
                for cb in self.callbacks:
                    cb.on_step_start(self)
                record = self.train_step()
                self._stop_if_diverged(record)
                losses.append(record["loss"])
                self._call_each("on_step_end", record)
        except BaseException:
            for cb in started:
                cb.on_train_stopped(self)
            raise
        self._end_callbacks()
        return losses

    def _load_callback_states(self) -> None:
        """Each callback's state as the resumed checkpoint saved it, after its on_train_start."""
        for cb in self.callbacks:
            saved = self._callback_states.get(type(cb).__name__)
            if saved:
                try:
                    cb.load_state_dict(saved)
                except (KeyError, TypeError, ValueError, AttributeError) as e:  # altered
                    raise unreadable(self._resumed_from, e, "trainer.pt") from e

    def _call_each(self, hook: str, *args: Any, done: list[Callback] | None = None) -> None:
        """Callback method `hook` on every callback in order (appending each to `done`). A
        stop asked for (`TrainingInterrupted` from Checkpointing: the step is saved) is
        raised after the callbacks that follow it have had their turn too: a user's order
        may put a metrics sink or validation after Checkpointing, and the saved step's
        records must not be lost (a resume goes on from the next step)."""
        interrupted: TrainingInterrupted | None = None
        for cb in self.callbacks:
            try:
                getattr(cb, hook)(self, *args)
            except TrainingInterrupted as e:
                interrupted = e
            if done is not None:
                done.append(cb)
        if interrupted is not None:
            raise interrupted

    def _end_callbacks(self) -> None:
        """Every callback's on_train_end (a stop asked for during the last checkpoint write
        is raised after them all). Any other error stops at once; the callbacks not yet
        ended, the failing one too, release what they opened (on_train_stopped)."""
        ended: list[Callback] = []
        try:
            self._call_each("on_train_end", done=ended)
        except TrainingInterrupted:
            raise
        except BaseException:
            for cb in self.callbacks[len(ended):]:
                cb.on_train_stopped(self)
            raise

