"""Evaluation of a trained run: loss, perplexity and bits per byte (`kiln.eval.perplexity`)."""


def eval_file(split: str) -> str:
    """The file `kiln eval` writes for `split`: eval.json is the held-out score the report
    shows; a look at the train split goes beside it, so it never replaces that score."""
    return "eval.json" if split == "val" else f"eval-{split}.json"


# every file `kiln eval` can write (eval.split's choices): a trained model's outputs, which
# `kiln train --fresh` moves aside with its checkpoints
EVAL_FILES = tuple(eval_file(split) for split in ("val", "train"))
