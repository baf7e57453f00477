"""Callback hooks: everything around the train step (logging, validation, checkpoints)."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from kiln import strict_json
from kiln.data.shards import load_unigram_bits
from kiln.errors import RunDataError, TrainingInterrupted
from kiln.eval.perplexity import evaluate
from kiln.train.checkpoint import save_checkpoint
from kiln.train.checkpoint_room import no_room_note
from kiln.train.checkpoint_weights import weights_are_finite
from kiln.train.stop_signals import StopRequests

if TYPE_CHECKING:
    from kiln.train.trainer import Trainer


class Callback:
    """Hooks called by `Trainer.fit`; `record` is the step's metrics, which callbacks may extend."""

    def on_train_start(self, trainer: Trainer) -> None: ...

    def on_step_start(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None: ...

    def on_train_end(self, trainer: Trainer) -> None: ...

    def on_train_stopped(self, trainer: Trainer) -> None:
        """The loop stopped with an error (divergence, a failed write, Ctrl-C): release what
        on_train_start opened; write nothing, the error's own message follows."""

    def state_dict(self) -> dict[str, Any]:
        """What the callback carries from step to step, saved in checkpoints (empty: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called after `on_train_start` when a run resumes with a saved state."""


class Validation(Callback):
    """Validation loss and bits per byte every `eval_every` steps and at the end, on the
    first `train.eval_batches` batches of `eval.batch_size` windows (not train.micro_batch,
    a memory setting that must not change which windows the curve is measured on). Each
    record carries the unigram baseline on the same windows (`val_unigram_bpb`): the whole
    split's can sit far above or below the curve's part of it."""

    baseline = False  # shards from before Kiln saved unigram counts have none

    def on_train_start(self, trainer: Trainer) -> None:
        try:
            self.baseline = load_unigram_bits(trainer.token_dir) is not None
        except RunDataError:  # a damaged counts file costs the baseline, not the training
            self.baseline = False

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        every = trainer.cfg.train.eval_every
        if (every and trainer.step % every == 0) or trainer.step == trainer.cfg.train.steps:
            self.run(trainer)

    def run(self, trainer: Trainer) -> None:
        t = trainer.cfg.train
        result = evaluate(
            trainer.model, trainer.token_dir, "val", t.seq_len, trainer.cfg.eval.batch_size,
            t.eval_batches,
            trainer.device, trainer.precision, trainer.env, unigram_baseline=self.baseline,
            doc_mask=trainer.model_cfg.doc_mask,
        )
        if not math.isfinite(result["loss"]):  # the update just made overflowed the weights
            raise trainer.diverged("the validation loss is not finite")
        trainer.log({"kind": "val", "step": trainer.step, "tokens": trainer.tokens_seen,
                     "val_loss": result["loss"], "val_bpb": result["bpb"],
                     **({"val_unigram_bpb": result["unigram_bpb_scored"]}
                        if "unigram_bpb_scored" in result else {})})
        if trainer.env.is_main:
            tqdm.write(f"step {trainer.step}: val loss {result['loss']:.4f}, "
                       f"val bits/byte {result['bpb']:.4f}", file=sys.stderr)


class Checkpointing(Callback):
    """Exact-resume checkpoints every `checkpoint_every` steps, at the end, and at the step
    where Ctrl-C or SIGTERM stopped training (`stop_signals`); never of non-finite weights
    (an update can overflow them while the loss and gradient norm that led to it were still
    finite; the trainer checks the folder is writable before step 1)."""

    def on_train_start(self, trainer: Trainer) -> None:
        self.stops = StopRequests().install()

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        every = trainer.cfg.train.checkpoint_every
        stop = self.stops.agreed(trainer.env, trainer.device)
        if stop or (every and trainer.step % every == 0) or \
                trainer.step == trainer.cfg.train.steps:
            if not weights_are_finite(trainer.model, trainer.env):
                raise trainer.diverged("the weights became non-finite (NaN or inf) in its "
                                       "update")
            saved = save_checkpoint(
                trainer.run_dir / "checkpoints", trainer.step, trainer.model, trainer.optimizer,
                trainer.state_dict(), trainer.env, keep=trainer.cfg.train.keep_checkpoints,
            )
            # said once a run (the resume may have said it), and not after the run's last
            # save: there is no next save to fail
            last = stop or trainer.step >= trainer.cfg.train.steps
            note = no_room_note(saved) if trainer.env.is_main and not (
                trainer.told_no_room or last) else ""
            if note:
                tqdm.write(note, file=sys.stderr)
                trainer.told_no_room = True
            # a signal during the write (a large model's takes minutes): the message said
            # training stops after this step, and this step is saved
            stop = stop or self.stops.agreed(trainer.env, trainer.device)
        if stop:  # even after the last step: the user asked `kiln run` to stop
            raise TrainingInterrupted(trainer.step, stop, str(trainer.run_dir / "checkpoints"))

    def on_train_end(self, trainer: Trainer) -> None:
        # a signal during the last step's checkpoint write came after that step's check:
        # the step is saved, but the user asked to stop, so `kiln run` must not go on
        stop = self.stops.agreed(trainer.env, trainer.device)
        self.stops.restore()
        if stop:
            raise TrainingInterrupted(trainer.step, stop, str(trainer.run_dir / "checkpoints"))

    def on_train_stopped(self, trainer: Trainer) -> None:
        self.stops.restore()


def progress_interval(elapsed_s: float, on_terminal: bool) -> float:
    """Seconds between progress-bar redraws. A terminal redraws one line (0.5 s). A log file
    gets a new line each time: every 15 s at first, then every twentieth of the time trained
    so far, at most every 5 minutes: a 3-day run's log holds ~900 lines, not 17,000."""
    return 0.5 if on_terminal else min(300.0, max(15.0, elapsed_s / 20))


class ProgressLog(Callback):
    """Progress bar (loss, tokens/s, ETA) and training records in metrics.jsonl. A record's
    `loss` is the mean over the steps since the last record (`loss_steps` of them): one
    step's loss is one batch's noise."""

    def on_train_start(self, trainer: Trainer) -> None:
        self.bar = tqdm(
            total=trainer.cfg.train.steps, initial=trainer.step, desc="train", unit="step",
            disable=not trainer.env.is_main, file=sys.stderr, dynamic_ncols=True,
            mininterval=progress_interval(0.0, sys.stderr.isatty()),
            # ETA from the mean wall time per step so far, validation and checkpoints in it:
            # tqdm's default (weighted to the last redraws) forgot them a few redraws later
            smoothing=0,
        )
        self.on_terminal, self.started = sys.stderr.isatty(), time.perf_counter()
        self.window_tokens, self.window_seconds, self.step_start = 0, 0.0, time.perf_counter()
        self.window_loss, self.window_steps = 0.0, 0

    def on_step_start(self, trainer: Trainer) -> None:
        self.step_start = time.perf_counter()

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        # a window times its steps alone: the validation and checkpoints that follow some
        # steps (after a logged one or not: eval_every need not be a multiple of
        # log_every) are not training time
        self.window_seconds += time.perf_counter() - self.step_start
        self.window_tokens += record["step_tokens"]
        self.window_loss += record["loss"]
        self.window_steps += 1
        if not self.on_terminal:  # a log file: fewer lines as the run goes on
            self.bar.mininterval = progress_interval(time.perf_counter() - self.started, False)
        self.bar.update(1)
        every = trainer.cfg.train.log_every
        if trainer.step % every and trainer.step != trainer.cfg.train.steps:
            return
        tps = self.window_tokens / max(self.window_seconds, 1e-9)
        loss, n_steps = self.window_loss / self.window_steps, self.window_steps
        self.window_tokens, self.window_loss, self.window_steps = 0, 0.0, 0
        self.window_seconds = 0.0
        trainer.log({
            "kind": "train", "step": trainer.step, "loss": loss, "loss_steps": n_steps,
            "lr": record["lr"],
            "grad_norm": record["grad_norm"], "tokens": trainer.tokens_seen,
            "tokens_per_s": tps, "elapsed_s": trainer.elapsed(),
            **{k: record[k] for k in ("aux_loss", "moe_max_vio", "moe_load") if k in record},
        })
        # shown at the bar's next redraw: refreshing now would add a line to a log file at
        # every logged step, whatever the interval
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}", refresh=False)

    def on_train_end(self, trainer: Trainer) -> None:
        self.bar.close()

    def on_train_stopped(self, trainer: Trainer) -> None:
        self.bar.close()  # ends the bar's line: the error's one line then starts its own

    # a checkpoint between two records carries the open window, so that the next record
    # after a resume averages the same steps an uninterrupted run's would
    def state_dict(self) -> dict[str, Any]:
        return {"loss": self.window_loss, "steps": self.window_steps,
                "tokens": self.window_tokens,
                "seconds": self.window_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The open window, each figure of the type this class saves: one of another type
        (a trainer.pt not as Kiln wrote it) is refused here, as the resume's other checks
        refuse it, where it failed the first step after the resume with a traceback."""
        for key, kinds in (("loss", (int, float)), ("steps", int), ("tokens", int),
                           ("seconds", (int, float))):
            value = state[key]
            negative = key != "loss" and isinstance(value, (int, float)) and value < 0
            if not isinstance(value, kinds) or isinstance(value, bool) or negative:
                raise ValueError(f"trainer.pt: the ProgressLog window's {key!r} is {value!r}")
        self.window_loss, self.window_steps = state["loss"], state["steps"]
        self.window_tokens = state["tokens"]
        self.window_seconds = state["seconds"]


def default_callbacks() -> list[Callback]:
    # order matters: log the step, then validate, then checkpoint what was logged
    return [ProgressLog(), Validation(), Checkpointing()]


def append_jsonl(path, record: dict[str, Any]) -> None:
    """Append one JSON line. A run killed mid-write leaves a last line without its newline:
    the next record starts on a line of its own rather than being glued to (and lost with)
    that fragment."""
    with open(path, "a+b") as f:
        torn = f.tell() > 0 and (f.seek(-1, 2), f.read(1))[1] != b"\n"
        f.write((("\n" if torn else "") + strict_json.dumps(record) + "\n").encode())
        f.flush()
