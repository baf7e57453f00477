"""The lr multiplier at every step against the schedules' closed forms, written here from
what ScheduleConfig says (not from schedule.py's arithmetic), over the edge cases: no
warmup, a run shorter than its warmup, one step after warmup, a decay as long as the run."""

from __future__ import annotations

import math

import pytest

from kiln.config import ScheduleConfig
from kiln.train.schedule import lr_multiplier


def closed_form(name: str, step: int, steps: int, warmup: int, floor: float,
                decay_fraction: float) -> float:
    """Warmup: step s (0-based) trains at (s + 1) / warmup, so the first step is not at 0
    and step warmup - 1 is at the peak. After it, the n = steps - warmup steps of the
    decay: cosine from 1 (the first of them) to `floor` (the last); wsd flat at 1, then
    its last d = decay_fraction x steps steps (at least 1, at most n) fall linearly, by
    (1 - floor) / d a step, reaching `floor` at the last."""
    if step < warmup:
        return (step + 1) / warmup
    if name == "constant":
        return 1.0
    n, k = steps - warmup, step - warmup
    if name == "cosine":
        done = k / (n - 1) if n > 1 else 1.0
        return floor + (1 - floor) * (1 + math.cos(math.pi * done)) / 2
    d = min(n, max(1, round(decay_fraction * steps)))
    into = step - (steps - d)  # 0 on the first decay step
    return 1.0 if into < 0 else 1 - (1 - floor) * (into + 1) / d


@pytest.mark.parametrize("name", ["cosine", "wsd", "constant"])
@pytest.mark.parametrize(("steps", "warmup"), [
    (1, 0), (2, 0), (7, 0), (100, 0),  # no warmup: the first step is at the peak
    (5, 8), (8, 8),  # the run ends inside (or as) its warmup: never decays
    (9, 8), (10, 8),  # one and two steps after warmup
    (100, 10), (37, 3),
])
@pytest.mark.parametrize("decay_fraction", [0.01, 0.2, 0.3, 1.0])
@pytest.mark.parametrize("floor", [0.0, 0.1, 1.0])
def test_the_multiplier_is_the_closed_form_at_every_step(name, steps, warmup, decay_fraction,
                                                         floor):
    cfg = ScheduleConfig(name=name, warmup_steps=warmup, min_lr_ratio=floor,
                         decay_fraction=decay_fraction)
    got = [lr_multiplier(s, steps, cfg) for s in range(steps)]
    want = [closed_form(name, s, steps, warmup, floor, decay_fraction) for s in range(steps)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    if warmup < steps and name != "constant":  # the last step is at the floor
        assert got[-1] == pytest.approx(floor)


@pytest.mark.parametrize(("old", "new", "step", "jump"), [
    # a longer warmup, resumed after the old one ended: cosine re-stretches, the lr moves
    (("schedule.warmup_steps=10",), ("schedule.warmup_steps=30",), 50, (0.00186, 0.00248)),
    # resumed inside the new warmup: the lr falls back below the peak it had reached
    (("schedule.name=constant", "schedule.warmup_steps=10"),
     ("schedule.name=constant", "schedule.warmup_steps=30"), 20, (0.003, 0.0021)),
    # past both warmups on a constant schedule: the change is said, the lr is the same
    (("schedule.name=constant", "schedule.warmup_steps=10"),
     ("schedule.name=constant", "schedule.warmup_steps=30"), 50, None),
    # a finished wsd run extended: its decay had ended at the floor; the new one is flat
    (("schedule.name=wsd",), ("schedule.name=wsd", "train.steps=200"), 100, (0.0003, 0.003)),
])
def test_a_resume_with_another_schedule_names_the_lr_it_changes(old, new, step, jump):
    from kiln.config import load_config
    from kiln.train.resume_settings import changed_since_recorded

    said = changed_since_recorded(load_config(None, ["train.steps=100", *old]),
                                  load_config(None, ["train.steps=100", *new]), step)
    assert said and not said[0].startswith("so the lr")  # the setting itself first
    lr_lines = [line for line in said if line.startswith("so the lr")]
    if jump is None:
        assert lr_lines == []
    else:
        before, now = jump
        # `step`: the checkpoint's; the lr said is the next step's, the first trained
        assert lr_lines == [f"so the lr at step {step + 1}, the first trained, is {now:.3g} "
                            f"where the recorded settings had {before:.3g}"]
