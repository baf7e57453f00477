"""A trained run's latest model, as it was trained: what eval, generate, export and the
perplexity filter read."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from kiln.config import Config, ConfigError, ModelConfig, recorded_config
from kiln.data.loader import accepts_fingerprint
from kiln.data.shards import load_index
from kiln.errors import CheckpointError, KilnError, RunDataError
from kiln.model import Transformer
from kiln.out_of_memory import out_of_memory, refused_allocation
from kiln.parallel.distributed import is_main_process
from kiln.parallel.meta_init import build_on_meta
from kiln.run_dir import run_arg
from kiln.train.checkpoint import load_weights, trained_shards
from kiln.train.checkpoint_dirs import latest_checkpoint, passed_over
from kiln.train.resume_settings import changed_model_settings
from kiln.train.train_setup import model_config_for_run


def load_trained_model(cfg: Config, ckpt: Path | None = None):
    """(model in eval mode on the CPU, checkpoint path) of the run's latest checkpoint (or
    `ckpt`), built with the model settings the run was trained with: an override such as
    `--set model.rope_theta=...` keeps every tensor's shape, so it would load and silently
    be another model."""
    ckpt = ckpt or latest_checkpoint(cfg.run_dir / "checkpoints")
    if ckpt is None:
        raise no_checkpoint(cfg.run_dir)
    note_an_older_checkpoint(ckpt)
    model_cfg = model_config_for_run(cfg, cfg.run_dir / "tokens")
    changed = changed_model_settings(recorded_config(cfg.run_dir), replace(cfg, model=model_cfg))
    if changed:
        raise ConfigError(f"{cfg.run_dir} was trained with other model settings than these "
                          f"({'; '.join(changed)}): its checkpoints are that model; drop the "
                          "[model] overrides, or train these settings in another run.dir")
    try:
        refuse_other_shards(ckpt, cfg.run_dir / "tokens")
        model = loaded_model(model_cfg, ckpt)
    except (CheckpointError, OSError) as e:
        if (ckpt / "trainer.pt").exists():  # still there: damaged, as the error says
            raise
        raise removed_while_read(ckpt) from e
    except RuntimeError as e:  # the weights alone: no batch or length setting helps
        if not out_of_memory(e):
            raise
        raise KilnError(f"cannot load {ckpt}: out of memory ({refused_allocation(e)}): the "
                        "model's weights alone do not fit this machine's free memory; use a "
                        "machine with more memory (or free some)") from e
    return model.eval(), ckpt


def no_checkpoint(run_dir: Path) -> FileNotFoundError:
    return FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'}: run "
                             f"`kiln train {run_arg(run_dir)}` first")


def note_an_older_checkpoint(ckpt: Path) -> None:
    """Say so when `latest` names a checkpoint that is not complete (its trainer.pt gone: a
    write never leaves one, so a hand did) or is gone (`passed_over`): the newest complete
    one, `ckpt`, stands in for it, and eval, generate and export read that older model
    without a word where a resume at least says the step it resumed from. Said by rank 0
    alone (a `kiln eval` under torchrun read the same checkpoint on every rank)."""
    skipped = passed_over(ckpt.parent, ckpt)
    if skipped and is_main_process():
        print(f"note: {skipped}: reading {ckpt.name}, the newest complete one", file=sys.stderr)


def loaded_model(model_cfg: ModelConfig, ckpt: Path) -> Transformer:
    """The model of `model_cfg` with checkpoint `ckpt`'s weights, fp32 on the CPU. Built with
    its parameters on the meta device and given the loaded tensors in their place: a CPU
    build drew a random init (seconds for a large model) only to overwrite it, and held the
    model twice at its peak."""
    model, _ = build_on_meta(lambda: Transformer(model_cfg))  # its init plan: never needed
    load_weights(ckpt, model)
    return model


def removed_while_read(ckpt: Path) -> CheckpointError:
    """The error for checkpoint `ckpt` gone while it was read: a `kiln train` of the same run
    prunes its older checkpoints as it saves new ones (or a user moved it). Not damage: the
    advice to move it aside for the one before it would send the user back a step."""
    newest = latest_checkpoint(ckpt.parent)
    now = (f"the newest now is {newest.name}: run the command again (or once the training "
           "has finished)" if newest else "no checkpoint is left")
    return CheckpointError(f"checkpoint {ckpt} was removed while it was being read (a "
                           f"`kiln train` of this run prunes older checkpoints as it saves); {now}")


def refuse_other_shards(ckpt: Path, tokens: Path) -> None:
    """The checkpoint records a fingerprint of the token shards it was trained on: shards
    re-made since (another tokenizer, other documents) would be read with the wrong
    vocabulary, or evaluated on what was training data. (A checkpoint from before Kiln hashed
    the shards' contents recorded their counts alone, and is compared by those.)"""
    trained_on = trained_shards(ckpt)
    if trained_on is not None and not accepts_fingerprint(load_index(tokens), trained_on):
        raise RunDataError(f"{ckpt} was trained on other token shards than {tokens} holds now "
                           "(`kiln tokenize` re-made them since): restore the run's shards, or "
                           "train on these (`kiln train --fresh`)")
