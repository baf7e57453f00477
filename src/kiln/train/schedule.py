"""Learning-rate schedules as pure functions of the step, so resuming needs only the step."""

from __future__ import annotations

import math

from kiln.config import ScheduleConfig


def lr_multiplier(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based).

    Linear warmup over `warmup_steps`, then
    - cosine: cosine decay from 1 to `min_lr_ratio` at the last step;
    - wsd: warmup-stable-decay — flat at 1, then a linear decay to `min_lr_ratio`
      over the final `decay_fraction` of the steps;
    - constant: flat at 1.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "cosine":
        span = total_steps - 1 - cfg.warmup_steps  # 0: the last step is the only one left
        progress = 1.0 if span <= 0 else min(1.0, (step - cfg.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.name == "wsd":
        decay_steps = max(1, round(cfg.decay_fraction * total_steps))
        decay_start = max(cfg.warmup_steps, total_steps - decay_steps)
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / max(1, total_steps - decay_start))
        return 1.0 - (1.0 - floor) * progress
    raise ValueError(f"unknown schedule '{cfg.name}'")


def schedule_warnings(total_steps: int, cfg: ScheduleConfig) -> list[str]:
    """What makes the schedule other than its name says: a warmup as long as the run never
    reaches the peak lr; a wsd warmup that runs into the decay shortens the decay."""
    if cfg.warmup_steps >= total_steps:
        end = lr_multiplier(total_steps - 1, total_steps, cfg)
        reach = ("the lr reaches optim.lr only at the last step" if end >= 1 else
                 f"the lr never reaches optim.lr (it ends at {end:.0%} of it)")
        return [f"schedule.warmup_steps ({cfg.warmup_steps}) >= train.steps ({total_steps}): "
                f"{reach} and never decays"]
    if cfg.name == "wsd":
        decay_steps = max(1, round(cfg.decay_fraction * total_steps))
        if cfg.warmup_steps > total_steps - decay_steps:
            return [f"schedule.warmup_steps ({cfg.warmup_steps}) runs into the wsd decay: it "
                    f"lasts {total_steps - cfg.warmup_steps} steps, not the {decay_steps} of "
                    f"schedule.decay_fraction = {cfg.decay_fraction}"]
    return []
