"""A trained run's latest model, as it was trained: what eval, generate, export and the
perplexity filter read."""

from __future__ import annotations

from dataclasses import replace

from kiln.config import Config, ConfigError, recorded_config
from kiln.model import Transformer
from kiln.train.checkpoint import load_weights
from kiln.train.checkpoint_dirs import latest_checkpoint
from kiln.train.trainer import changed_model_settings, model_config_for_run


def load_trained_model(cfg: Config):
    """(model in eval mode on the CPU, checkpoint path) of the run's latest checkpoint, built
    with the model settings the run was trained with: an override such as
    `--set model.rope_theta=...` keeps every tensor's shape, so it would load and silently
    be another model."""
    ckpt = latest_checkpoint(cfg.run_dir / "checkpoints")
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint in {cfg.run_dir / 'checkpoints'}: run `kiln train` "
                                "first")
    model_cfg = model_config_for_run(cfg, cfg.run_dir / "tokens")
    changed = changed_model_settings(recorded_config(cfg.run_dir), replace(cfg, model=model_cfg))
    if changed:
        raise ConfigError(f"{cfg.run_dir} was trained with other model settings than these "
                          f"({'; '.join(changed)}): its checkpoints are that model; drop the "
                          "[model] overrides, or train these settings in another run.dir")
    model = Transformer(model_cfg)
    load_weights(ckpt, model)
    return model.eval(), ckpt
