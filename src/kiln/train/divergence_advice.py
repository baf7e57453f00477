"""What a diverged run's message tells the user to change: the settings that set its step.

Why its own: under Muon the hidden matrices train at `optim.muon_lr`, not `optim.lr`, so
"lower optim.lr" alone left the weights that blew up on the step that blew them up; and
"set optim.grad_clip" read as advice to turn on a clip that was on (its default is 1.0).
"""

from __future__ import annotations

from kiln.config import OptimConfig


def divergence_advice(optim: OptimConfig) -> str:
    """'lower ...' naming each lr that drives the updates with the value the run's settings
    give it now (config.toml records them: a plain re-run diverges the same way), then the
    clip: set it where it is off, lower it where it is on."""
    adamw = (f"optim.lr (`--set optim.lr=...`: {optim.lr:g} is what config.toml records "
             "now)")
    if optim.name == "muon" and (optim.muon_lr or optim.muon_adjust_lr == "original"):
        from kiln.optim.muon import muon_peak_lr

        given = "" if optim.muon_lr else " (optim.muon_lr = 0 gives it)"
        lower = (f"lower optim.muon_lr (`--set optim.muon_lr=...`: the hidden matrices train "
                 f"at {muon_peak_lr(optim):g}{given}) and {adamw}")
    else:  # AdamW, or Muon sized by optim.lr ('match_rms_adamw' with muon_lr = 0)
        lower = f"lower {adamw}"
    if optim.grad_clip:
        return f"{lower}, or lower optim.grad_clip ({optim.grad_clip:g} now)"
    return f"{lower} or set optim.grad_clip"
