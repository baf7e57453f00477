"""Which settings a resume may change, and which make the checkpoint another model's.

Why its own: `kiln train` asks it when it resumes, `kiln run` before its data stages (so a
refused resume costs no data work), and a loaded model's checks (`trained_run`) compare a
run's model settings the same way; none of them needs a trainer.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from kiln.config import Config, config_changes, data_changes
from kiln.errors import ResumeRefused
from kiln.train.schedule import lr_multiplier

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


def changed_since_recorded(old: Config | None, cfg: Config, step: int) -> list[str]:
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
        # `step` is the checkpoint's (steps done); the lr is the next one's, logged as step + 1
        changed.append(f"so the lr at step {step + 1}, the first trained, is {lr_now:.3g} "
                       f"where the recorded settings had {lr_before:.3g}")
    return changed


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
    data = data_changes(old, cfg)
    changed += data
    # `kiln train --fresh` trains on the data on disk, and refuses it as made otherwise
    again = ("`kiln run --fresh` with the recipe and these --set options (it makes the data "
             "again; the old outputs move to archive/)" if data else
             "`kiln train --fresh` (the old outputs move to archive/)")
    if changed:
        raise ResumeRefused(
            f"cannot resume from {ckpt}: it was trained with other settings "
            f"({'; '.join(changed)}); use the run's config, start over with {again}, or "
            "train the new settings in another run.dir")
