"""The training loop. `train_step` reads top to bottom; everything else is a callback."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from kiln import strict_json
from kiln.atomic import write_json_atomic
from kiln.config import (
    Config,
    ConfigError,
    config_changes,
    data_changes,
    design_notes,
    design_problems,
    flat_settings,
    recorded_config,
)
from kiln.data.loader import TokenLoader, TokenStream, counts_only, masking_eos_id
from kiln.data.prepare_signature import prepare_settings_differ
from kiln.data.provenance import check_tokens_current, data_settings_differ
from kiln.data.shards import load_index
from kiln.errors import (
    CheckpointError,
    KilnError,
    TrainingDiverged,
    TrainingInterrupted,
    alike_on_every_rank,
)
from kiln.export_recovery import stranded_exports
from kiln.model import Transformer, count_params, flops_per_token
from kiln.model.balancing import max_violation
from kiln.model.doc_mask import document_ids
from kiln.optim import build_optimizer
from kiln.parallel.distributed import (
    all_reduce_max,
    all_reduce_mean,
    all_reduce_sum,
    grad_sync,
    init_distributed,
    local_device,
    parallelize,
    run_on_every_rank,
    run_on_main,
)
from kiln.parallel.meta_init import build_on_meta
from kiln.run_dir import write_run_metadata
from kiln.train.callbacks import Callback, append_jsonl, default_callbacks
from kiln.train.checkpoint import (
    archive_checkpoints,
    cannot_write,
    check_checkpoint,
    check_writable,
    load_checkpoint,
    missing_state,
    unreadable,
)
from kiln.train.checkpoint_dirs import (
    checkpoint_step,
    complete_checkpoints,
    latest_checkpoint,
    pointed_name,
)
from kiln.train.host_memory import keep_freed_memory
from kiln.train.memory_fit import check_training_fits
from kiln.train.metrics_tail import set_aside_records_after
from kiln.train.precision import autocast, resolve_device, resolve_precision
from kiln.train.schedule import lr_multiplier, schedule_warnings


def model_config_for_run(cfg: Config, token_dir: Path):
    """The model config with the vocabulary taken from the token shards."""
    vocab = load_index(token_dir)["vocab_size"]
    if cfg.model.vocab_size and cfg.model.vocab_size < vocab:
        raise ConfigError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's ({vocab}, "
            f"{Path(token_dir) / 'index.json'}): set model.vocab_size = 0 to take the tokenizer's"
        )
    return dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or vocab)


def fit_micro_batch(global_batch: int, micro_batch: int, world_size: int) -> int:
    """The largest micro-batch <= train.micro_batch that splits each rank's share of the
    global batch evenly. micro_batch only bounds memory (the step's gradient is the same),
    so a recipe made for one process runs unchanged on several."""
    if global_batch % world_size:
        raise ConfigError(f"train.global_batch ({global_batch}) must be divisible by the number "
                          f"of ranks ({world_size})")
    per_rank = global_batch // world_size
    return max(m for m in range(1, min(micro_batch, per_rank) + 1) if per_rank % m == 0)


def check_splits(token_dir: Path, seq_len: int) -> None:
    """Both splits must hold a window of seq_len + 1 tokens before training starts (a val
    split without one would fail only after all the steps, before the final checkpoint)."""
    index = load_index(token_dir)
    documents = index["train"]["documents"] + index["val"]["documents"]
    for split in ("val", "train"):
        tokens = TokenStream(token_dir, split).n_tokens
        if tokens >= seq_len + 1:
            continue
        if documents < 2:
            fix = (f"the data holds {documents} document(s) and the split is by whole "
                   "document, so add documents (or split the text into several files)")
        else:
            fix = (f"the split is by whole document (train has {index['train']['documents']}, "
                   f"val {index['val']['documents']}): change data.val_fraction or run.seed and "
                   "re-run `kiln tokenize`, add data, or lower train.seq_len")
        raise ConfigError(f"the {split} split has {tokens} tokens, fewer than one window of "
                          f"train.seq_len + 1 = {seq_len + 1}: {fix}")


# model settings a resume may change: the kernel that computes the same attention, the
# longest sequence the model accepts, settings that only shape the initial weights, and the
# MoE training losses and balancing rule (they steer training, not the function)
_RESUMABLE_MODEL_KEYS = frozenset({
    "model.attn_kernel", "model.max_seq_len", "model.init_std", "model.post_norm_gain",
    "model.router_init_std", "model.seq_aux_coef", "model.z_loss_coef", "model.balance",
    "model.balance_rate", "model.smebu_beta", "model.smebu_kappa"})
# of those, the ones read only when the weights are first made: a resume keeps its weights
_INIT_ONLY_MODEL_KEYS = frozenset({"model.init_std", "model.post_norm_gain", "model.router_init_std"})


def changed_model_settings(old: Config | None, cfg: Config) -> list[str]:
    """'key: old -> new' for the model settings of `cfg` (its vocabulary resolved) that make
    another function than the one the run recorded in `old` was trained as. Settings that
    keep every tensor's shape (rope_theta, norm_eps, top_k...) pass the checkpoint's shape
    check, so only this comparison catches them."""
    if old is None:
        return []
    vocab = old.model.vocab_size or cfg.model.vocab_size  # 0 (auto) as resolved now
    old = dataclasses.replace(old, model=dataclasses.replace(old.model, vocab_size=vocab))
    return [c for c in config_changes(old, cfg, ("model.",))
            if c.split(":")[0] not in _RESUMABLE_MODEL_KEYS]


def _changed_since_recorded(old: Config | None, cfg: Config, step: int) -> list[str]:
    """Training settings that differ from the run's recorded config (a resume with another lr
    or step count, or MoE loss and balancing settings, is allowed, but said; other model and
    data changes are refused elsewhere), and
    the jump in the learning rate that follows: a schedule is a function of train.steps, so
    more steps re-stretch a cosine decay (a wsd run extended in its stable phase does not
    jump)."""
    if old is None:
        return []
    changed = config_changes(old, cfg, ("optim.", "schedule.", "train."))
    # the [model] keys a resume may change (the MoE losses and balancing: Trinity Large
    # added its z-loss mid-run) are said too, not applied silently; init-only ones do nothing
    for change in config_changes(old, cfg, ("model.",)):
        key = change.split(":")[0]
        if key in _INIT_ONLY_MODEL_KEYS:
            changed.append(f"{change} (initial weights only: no effect on a resumed model)")
        elif key in _RESUMABLE_MODEL_KEYS:
            changed.append(change)
    # validation measures train.eval_batches batches of eval.batch_size windows: another
    # batch size measures other windows, and the val curve steps where the resume is
    changed += [f"{c} (validation measures other windows from here on)"
                for c in config_changes(old, cfg, ("eval.batch_size",))]
    lr_before = old.optim.lr * lr_multiplier(step, old.train.steps, old.schedule)
    lr_now = cfg.optim.lr * lr_multiplier(step, cfg.train.steps, cfg.schedule)
    if changed and step < cfg.train.steps and not math.isclose(lr_before, lr_now, rel_tol=1e-3):
        changed.append(f"so the lr at step {step} is {lr_now:.3g} where the recorded "
                       f"settings had {lr_before:.3g}")
    return changed


def _resume_told(e: BaseException, ckpt: Path) -> str:
    """How a rank's failure to read checkpoint `ckpt` is told, after "rank R"."""
    if isinstance(e, KeyboardInterrupt):
        return (f"was interrupted while it read checkpoint {ckpt} "
                f"({type(e).__name__}{f': {e}' if str(e) else ''})")
    if isinstance(e, KilnError):
        return f"could not resume: {e}"
    return f"could not read checkpoint {ckpt} ({type(e).__name__}: {e})"


def _told_by_rank_zero(e: BaseException) -> str:
    """Rank 0's failure in its own part of the start (`Trainer._on_main`), as the other
    ranks raise it: a Kiln error's own line."""
    if isinstance(e, KilnError):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return f"rank 0 was interrupted before training started ({type(e).__name__})"
    return f"rank 0 failed before training started ({type(e).__name__}: {e})"


def refuse_changed_model(ckpt: Path, old: Config | None, cfg: Config) -> None:
    """A checkpoint continues the function it was trained as, on the data it was trained
    on: other model settings would silently train another model (see
    `changed_model_settings`); another optimizer cannot take the checkpoint's optimizer
    state; other data settings (or windows: train.seq_len) describe data that is not on
    disk. (`kiln run` asks this before its data stages too.)"""
    if old is None:
        return
    changed = changed_model_settings(old, cfg)
    # train.seq_len cuts the shards into other windows: the loader's position means other
    # data (named here, and by `kiln run` before its data stages, not by the loader after)
    changed += config_changes(old, cfg, ("optim.name", "train.seq_len"))
    changed += data_changes(old, cfg)
    if changed:
        raise CheckpointError(
            f"cannot resume from {ckpt}: it was trained with other settings "
            f"({'; '.join(changed)}); use the run's config, start over with `kiln train "
            "--fresh` (the old outputs move to archive/), or train the new settings in another "
            "run.dir")


class Trainer:
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
        if self.micro_batch != t.micro_batch and self.env.is_main:
            share = (f"{self.env.world_size} ranks share" if self.env.distributed
                     else "one process runs")
            print(f"note: {share} train.global_batch = {t.global_batch}: each runs "
                  f"micro-batches of {self.micro_batch} (train.micro_batch = {t.micro_batch} is "
                  "the most one runs at once)", file=sys.stderr)
        if t.parallel == "fsdp" and not self.env.distributed:  # ddp is the default: said only
            print("note: train.parallel = 'fsdp' applies under torchrun (torchrun "  # if asked
                  "--nproc_per_node=N -m kiln train RUN); one process trains the model unwrapped",
                  file=sys.stderr)
        if self.env.is_main and self.device.type == "cpu":
            self._note_threads()
        if self.env.is_main:
            for warning in schedule_warnings(t.steps, cfg.schedule):
                print(f"warning: {warning}", file=sys.stderr)
        self.accum_steps = t.global_batch // self.env.world_size // self.micro_batch

        torch.manual_seed(cfg.run.seed)
        with alike_on_every_rank():  # the run's shards and the settings: said once, not per rank
            self.model_cfg = model_config_for_run(cfg, self.token_dir)
        self.given_vocab = cfg.model.vocab_size  # 0: the tokenizer's, recorded so
        self.cfg = dataclasses.replace(cfg, model=self.model_cfg)
        check_training_fits(self.model_cfg, cfg.optim.name, self.device, t.parallel,
                            self.env.world_size)
        # weights on the meta device: `parallelize` makes them where they train (a device,
        # FSDP2 shards), drawn as a CPU build draws them, one parameter at a time
        raw, init = build_on_meta(lambda: Transformer(self.model_cfg))
        self.raw_model = raw
        self.figures = {**count_params(raw),
                        "flops_per_token": flops_per_token(self.model_cfg, t.seq_len)}
        self.model = parallelize(raw, t.parallel, self.env, compile=t.compile,
                                 device=self.device, init=init)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        check_tokens_current(self.run_dir)  # not made from documents or a tokenizer since replaced
        check_splits(self.token_dir, t.seq_len)  # before training, not at its end
        self.eos_id = masking_eos_id(self.token_dir, self.model_cfg.doc_mask)  # None: no mask
        self.loader = TokenLoader(self.token_dir, "train", t.seq_len, t.global_batch,
                                  cfg.run.seed, self.env.rank, self.env.world_size)
        if counts_only(self.loader.stream.index) and self.env.is_main:
            print(f"note: {self.token_dir / 'index.json'} was written before Kiln hashed each "
                  "shard's contents: only their sizes are checked, so shards changed in place or "
                  "re-made with the same counts go unnoticed (re-run `kiln tokenize` to record "
                  "the hashes, before training or with `kiln train --fresh`)", file=sys.stderr)
        if self.loader.n_windows < t.global_batch and self.env.is_main:
            print(f"note: the train split holds {self.loader.n_windows} windows of "
                  f"train.seq_len = {t.seq_len}, fewer than one batch of train.global_batch = "
                  f"{t.global_batch}: every step repeats windows within its batch (more data, "
                  "or a smaller global_batch)", file=sys.stderr)
        elif t.steps * t.global_batch > self.loader.n_windows and self.env.is_main:
            # past one pass the loader wraps and reshuffles without a word: a run sized by
            # steps can repeat its data many times over (overfitting a small corpus)
            passes = t.steps * t.global_batch / self.loader.n_windows
            print(f"note: train.steps = {t.steps} of train.global_batch = {t.global_batch} "
                  f"windows make {passes:.2f} passes over the train split's "
                  f"{self.loader.n_windows} windows of train.seq_len = {t.seq_len} (each pass "
                  "in a new order): the model sees its data more than once", file=sys.stderr)
        self.callbacks = default_callbacks() if callbacks is None else callbacks
        self.step, self.tokens_seen, self._elapsed_before = 0, 0, 0.0
        self._callback_states: dict[str, dict[str, Any]] = {}
        self._resumed_from: Path | None = None
        self._start = time.perf_counter()
        # outputs of an earlier run with no checkpoint to continue from: --fresh, or a run
        # stopped before its first checkpoint (or whose checkpoints were moved away)
        self._archive_earlier = None if resume else "fresh"  # why earlier outputs move aside
        if resume:
            self._maybe_resume()
        # the settings against the run's data and design: every rank meets these alike
        with alike_on_every_rank():
            if self.step == 0:  # a new model records its settings: they must describe its data
                t = cfg.tokenizer
                differ = prepare_settings_differ(cfg.prepare, self.run_dir, cfg.data.sources,
                                                 cfg.data.max_bytes, cfg.data.text_field)
                differ += data_settings_differ(self.run_dir, cfg.run.seed, cfg.data.val_fraction, {
                    "kind": t.kind, "vocab_size": t.vocab_size, "min_frequency": t.min_frequency})
                if differ:
                    raise ConfigError(
                        f"the data in {self.run_dir} was made with other settings "
                        f"({'; '.join(differ)}): train on it with those, or re-make it "
                        "(`kiln prepare` / `kiln tokenizer` / `kiln tokenize`, or `kiln run`) first")
            for problem in design_problems(self.model_cfg):
                if self.step == 0:  # a new model: refused; a run trained so goes on as it was
                    raise ConfigError(problem)
                if self.env.is_main:
                    print(f"note: {problem} (this run was trained so; it resumes as it was)",
                          file=sys.stderr)
        if self.step == 0 and self.env.is_main:  # said once, when the model is made
            for line in design_notes(self.model_cfg):
                print(f"note: {line}", file=sys.stderr)

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        callbacks = {type(cb).__name__: cb.state_dict() for cb in self.callbacks}
        return {"step": self.step, "tokens_seen": self.tokens_seen,
                "elapsed_s": self.elapsed(), "loader": self.loader.state_dict(),
                "callbacks": {name: state for name, state in callbacks.items() if state}}

    def _maybe_resume(self) -> None:
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        self._check_ranks_agree(ckpt)
        if ckpt is None:
            self._refuse_mixing_with_earlier_outputs()
            return
        recorded = recorded_config(self.run_dir)
        with alike_on_every_rank():  # the settings and the checkpoint every rank agreed on
            refuse_changed_model(ckpt, recorded, self.cfg)
        # what may fail on some ranks alone (a node's own copy of the files, its token shards),
        # agreed before the collectives of loading, which the others would wait in
        state = run_on_every_rank(self.env, lambda: self._read_resume_state(ckpt),
                                  lambda e: _resume_told(e, ckpt), CheckpointError)
        with alike_on_every_rank():  # the same checked bytes on every rank
            state = load_checkpoint(ckpt, self.model, self.optimizer, state)
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self._elapsed_before = state["elapsed_s"]
        self._callback_states = state.get("callbacks", {})  # none in older checkpoints
        self._resumed_from = ckpt
        if self.env.is_main:
            print(f"resumed from {ckpt} at step {self.step}", file=sys.stderr)
            if self.loader.resumed_on_counts:
                print(f"note: {ckpt} was saved on token shards whose contents were not hashed "
                      "(an older Kiln or index.json): these match it by their counts; their "
                      "contents cannot be compared (the next checkpoint records them)",
                      file=sys.stderr)
            changed = _changed_since_recorded(recorded, self.cfg, self.step)
            if changed:
                print(f"note: resuming with settings changed since the run's config.toml was "
                      f"recorded: {'; '.join(changed)}", file=sys.stderr)
            if self.step >= self.cfg.train.steps:
                print(f"step {self.step} >= train.steps = {self.cfg.train.steps}: nothing to "
                      "train; raise train.steps to go on", file=sys.stderr)

    def _read_resume_state(self, ckpt: Path) -> dict[str, Any]:
        """Checkpoint `ckpt`'s files checked and its trainer state read, the loader set to
        its position: this rank's part of a resume, without a collective."""
        state = check_checkpoint(ckpt)
        missing_state(ckpt, state, ("step", "tokens_seen", "elapsed_s", "loader"))
        try:
            self.loader.load_state_dict(state["loader"])
        except (KeyError, TypeError, AttributeError) as e:  # not a loader's state: altered
            raise unreadable(ckpt, e) from e
        except ValueError as e:
            raise CheckpointError(f"cannot resume from {ckpt}: {e}; the token shards, "
                                  "train.seq_len or run.seed changed since it was saved; use "
                                  "the run's config, or `kiln train --fresh`") from e
        return state

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
        earlier = old.get("launches") or [{"from_step": 1, **{k: old.get(k) for k in how}}]
        # a launch stopped before its first checkpoint left no steps: this one replaces it
        earlier = [e for e in earlier if e.get("from_step", 1) < here["from_step"]] or earlier[:1]
        same = {k: v for k, v in earlier[-1].items() if k != "from_step"} == how
        return earlier if same else [*earlier, here]

    def _note_threads(self) -> None:
        """torchrun sets OMP_NUM_THREADS=1 for several processes unless told otherwise: on
        CPU each rank then uses one core however many the machine has."""
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        cores = os.cpu_count() or 1
        if ranks_here > 1 and torch.get_num_threads() == 1 and cores >= 2 * ranks_here:
            print(f"note: each of the {ranks_here} ranks on this machine computes on 1 thread "
                  f"(OMP_NUM_THREADS=1, torchrun's default) of {cores} cores; launch with "
                  f"OMP_NUM_THREADS={cores // ranks_here} to use them all", file=sys.stderr)

    def _stop_if_diverged(self, record: dict[str, Any]) -> None:
        """A non-finite loss or gradient norm has poisoned the weights (the update already
        ran): stop before any callback logs or checkpoints them, so the checkpoints on disk
        stay finite and `keep_checkpoints` never rotates the good ones out."""
        if math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"]):
            return
        raise self.diverged(f"loss {record['loss']}, gradient norm {record['grad_norm']}")

    def diverged(self, what: str) -> TrainingDiverged:
        """The error for a run that diverged at this step, saying which checkpoint to go on
        from. The newest may already hold weights on their way to blowing up (finite, but
        huge): if resuming from it diverges again at once, an older one is named."""
        done = complete_checkpoints(self.run_dir / "checkpoints")
        # the run dir's config.toml now records these settings, and a run dir trains with its
        # recorded ones: a plain re-run would diverge the same way
        lower = (f"lower optim.lr (`--set optim.lr=...`: {self.cfg.optim.lr:g} is what "
                 "config.toml records now) or set optim.grad_clip")
        if not done:
            since = f"no checkpoint was written yet: {lower}, and start again"
        else:
            since = (f"the last checkpoint, {done[-1].name}, is from before it: {lower}, and "
                     "run `kiln train` again to resume from there")
            if len(done) > 1:
                since += (f"; if that diverges again at once, move {done[-1].name} out of "
                          f"checkpoints/ to resume from {done[-2].name}")
        self._log_divergence(what)
        return TrainingDiverged(f"training diverged at step {self.step}: {what}; {since}")

    def _log_divergence(self, what: str) -> None:
        """A `diverged` record in metrics.jsonl (no figures: nothing poisoned is logged), so
        the run's report says it diverged, where its last logged step alone reads as a run
        killed before its next checkpoint. A resume moves it to archive/ with the steps
        after its checkpoint."""
        try:
            self.log({"kind": "diverged", "step": self.step, "what": what})
        except CheckpointError:  # a disk that cannot take it: the divergence is the error
            pass


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

    def elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._start

    def log(self, record: dict[str, Any]) -> None:
        if self.env.is_main:
            path = self.run_dir / "metrics.jsonl"
            try:
                append_jsonl(path, record)
            except OSError as e:
                raise cannot_write(self.run_dir / "checkpoints", str(path), e) from e

    # -- the step ------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        batch = self.loader.next_batch().to(self.device)
        lr = self.cfg.optim.lr * lr_multiplier(self.step, self.cfg.train.steps, self.cfg.schedule)
        for group in self.optimizer.param_groups:  # Muon groups keep their lr ratio
            group["lr"] = lr * group.get("lr_scale", 1.0)

        loss_sum = torch.zeros((), device=self.device)
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
        # one device-to-host read for both figures: each read waits for the GPU to finish
        loss_value, norm_value = torch.stack([loss.float(), grad_norm.float()]).tolist()
        record = {"loss": loss_value, "lr": lr, "grad_norm": norm_value,
                  "step_tokens": step_tokens}
        if moe:
            record["moe_max_vio"] = [max_violation(c) for c in step_counts]  # the global step's load
            record["moe_load"] = [(c.double() / max(1, int(c.sum()))).tolist() for c in step_counts]
        return record

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

    def _on_main(self, work: Callable[[], None]) -> None:
        """`work` (on the run's files) on rank 0 alone, the other ranks told how it went: a
        disk that refuses rank 0's writes stops every rank with its error, said once, where
        the others met a lost rank at their first step (or, with nothing to train, exited 0)."""
        run_on_main(self.env, work, _told_by_rank_zero, CheckpointError)

    def _make_way(self) -> None:
        """Before anything is written or trained: the earlier model's outputs moved aside
        (kept, but out of the new run's way), the checkpoints folder found writable."""
        if self._archive_earlier:
            moved = self._archive_earlier_outputs()
            if moved:
                print(f"the earlier model's checkpoints, metrics and outputs moved to {moved}",
                      file=sys.stderr)
        check_writable(self.run_dir / "checkpoints")

    def _record_the_start(self) -> None:
        self._set_aside_later_records()
        self._write_metadata()

    def fit(self) -> list[float]:
        """Train to `train.steps`; returns the losses of the steps run here."""
        self._start = time.perf_counter()
        if self.step >= self.cfg.train.steps:  # nothing to train: leave the run as it is
            self._on_main(self._set_aside_later_records)
            return []
        self._on_main(self._make_way)
        losses, started = [], []
        try:
            for cb in self.callbacks:
                cb.on_train_start(self)
                started.append(cb)
                saved = self._callback_states.get(type(cb).__name__)
                if saved:
                    try:
                        cb.load_state_dict(saved)
                    except (KeyError, TypeError, ValueError, AttributeError) as e:  # altered
                        raise unreadable(self._resumed_from, e) from e
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
