"""Evaluation of a trained run: loss, perplexity and bits per byte (`kiln.eval.perplexity`)."""

import math


def eval_file(split: str) -> str:
    """The file `kiln eval` writes for `split`: eval.json is the held-out score the report
    shows; a look at the train split goes beside it, so it never replaces that score."""
    return "eval.json" if split == "val" else f"eval-{split}.json"


def windows_file(split: str) -> str:
    """The per-window losses `kiln eval` writes beside `eval_file(split)`
    (`kiln.eval.window_losses`)."""
    return "eval_windows.npy" if split == "val" else f"eval-{split}_windows.npy"


# every file `kiln eval` can write (eval.split's choices): a trained model's outputs, which
# `kiln train --fresh` moves aside with its checkpoints
EVAL_FILES = tuple(name(split) for split in ("val", "train") for name in (eval_file, windows_file))


def perplexity_of(loss: float) -> float:
    """exp(loss), or inf where that overflows a float (a loss above ~709.78): a capped figure
    would read as a real one."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def perplexity_text(value: float) -> str:
    """A perplexity for people: two decimals (four digits past a million), or why it is inf."""
    if value == math.inf:
        return "inf (exp of a loss above 709.78 overflows a float)"
    return f"{value:.2f}" if abs(value) < 1e6 else f"{value:.4g}"
