"""A Kiln run's latest checkpoint as a scorer: per-sequence negative log-likelihood, batched.

Shared by the perplexity scorer and the Kiln-model junk judge. Documents are scored the way
training sees them: Kiln puts EOS between documents, so the EOS id is the context that
precedes a document's first token and every document token is predicted; a model trained
with `model.doc_mask` scores them with training's document ids (`continuation_nll`'s `eos_id`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:  # imported lazily at run time: only a scorer that runs needs them
    from tokenizers import Tokenizer

    from kiln.model import Transformer


def check_run_dir(run_dir: str | Path) -> Path:
    """Fail early (before an executor starts) when the run cannot provide a scorer."""
    from kiln.run_dir import run_arg
    from kiln.train.checkpoint_dirs import latest_checkpoint

    run_dir = Path(run_dir)
    missing = [p for p in ("config.toml", "tokenizer/tokenizer.json", "tokens/index.json")
               if not (run_dir / p).is_file()]
    if missing:
        raise FileNotFoundError(f"{run_dir} is not a trained Kiln run: missing {', '.join(missing)}")
    if latest_checkpoint(run_dir / "checkpoints") is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'}: run "
                                f"`kiln train {run_arg(run_dir)}` first")
    return run_dir


def checkpoint_identity(run_dir: str | Path, ckpt: Path | None = None) -> str:
    """Which weights the run's latest checkpoint (or `ckpt`) holds: its name and its model
    file's sha256 (from checksums.json; its size and mtime for a checkpoint from before them).
    A score stored under another checkpoint of the same run is another model's, not to be
    reused."""
    import json

    from kiln.train.checkpoint import CHECKSUMS
    from kiln.train.checkpoint_dirs import latest_checkpoint

    ckpt = ckpt or latest_checkpoint(Path(run_dir) / "checkpoints")
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint in {Path(run_dir) / 'checkpoints'}")
    try:
        weights = json.loads((ckpt / CHECKSUMS).read_text(encoding="utf-8"))["model.safetensors"]
    except (OSError, ValueError, KeyError, TypeError):
        stat = (ckpt / "model.safetensors").stat()
        weights = f"{stat.st_size}-{stat.st_mtime_ns}"
    return f"{ckpt.name}:{str(weights)[:16]}"


def run_max_seq_len(run_dir: str | Path) -> int:
    """The context of the run's model, from its recorded config (no weights loaded): what a
    scorer's settings are checked against when the pipeline is built, not in a worker after
    the stages before it ran."""
    from kiln.config import load_config, run_dir_override

    run_dir = check_run_dir(run_dir)
    cfg = load_config(run_dir / "config.toml", [run_dir_override(run_dir)], recorded=True)
    return cfg.model.max_seq_len


def load_run_model(run_dir: str | Path, device: str = "cpu") -> tuple[Transformer, Tokenizer, Path]:
    """(model in eval mode, tokenizer, checkpoint path) of the run's latest checkpoint."""
    from kiln.config import load_config, run_dir_override
    from kiln.data.provenance import run_tokenizer
    from kiln.train.trained_run import load_trained_model

    run_dir = check_run_dir(run_dir)
    model, ckpt = load_trained_model(load_config(run_dir / "config.toml", [run_dir_override(run_dir)],
                                                 recorded=True))
    tok = run_tokenizer(run_dir)
    return model.eval().to(device), tok, ckpt


def load_pinned_run_model(run_dir: str | Path, device: str, checkpoint: str,
                          what: str) -> tuple[Transformer, Tokenizer, Path]:
    """`load_run_model`, refused (CheckpointError) when the run's latest checkpoint is no
    longer `checkpoint` (`checkpoint_identity` when the stage was made, in the prepare's
    main process): a run training on while a prepare scores with it would have tasks score
    with other weights than the others, or than the identity their scores are stored under."""
    from kiln.errors import CheckpointError

    model, tok, ckpt = load_run_model(run_dir, device)
    if (found := checkpoint_identity(run_dir, ckpt)) != checkpoint:
        raise CheckpointError(
            f"the {what} {run_dir} is checkpoint {checkpoint} but its run now holds {found} "
            "(it trained on since the pipeline was built): its tasks would score with other "
            "weights; run prepare again once that run has stopped writing checkpoints")
    return model, tok, ckpt


@torch.no_grad()
def continuation_nll(
    model: nn.Module,
    prefixes: list[list[int]],
    targets: list[list[int]],
    device: str | torch.device = "cpu",
    eos_id: int | None = None,
) -> list[tuple[float, int]]:
    """(summed NLL in nats, token count) of each target given its prefix, in one forward.

    Rows are right-padded; causal attention means padding never changes a real position.
    Every prefix needs at least one token (the context of the first target token). With
    `eos_id`, a model trained with `model.doc_mask` sees each token attend only to its own
    document, as every training step did (an EOS ends its document): a document scored after
    `[EOS]` is predicted from that EOS for its first token alone, as in training, where its
    other tokens never saw it.
    """
    if len(prefixes) != len(targets):
        raise ValueError("prefixes and targets must have the same length")
    if not prefixes:
        return []
    if any(not p for p in prefixes):
        raise ValueError("every prefix needs at least one token (e.g. the EOS id)")
    seqs = [p + t for p, t in zip(prefixes, targets)]
    width = max(len(s) for s in seqs) - 1
    if width < 1:
        return [(0.0, 0) for _ in seqs]
    inputs = torch.zeros(len(seqs), width, dtype=torch.long)
    labels = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prefixes, seqs)):
        n = len(s) - 1
        inputs[i, :n] = torch.tensor(s[:-1])
        labels[i, :n] = torch.tensor(s[1:])
        mask[i, len(p) - 1 : n] = True  # positions whose next token is a target token
    if eos_id is not None and getattr(getattr(model, "cfg", None), "doc_mask", False):
        from kiln.model.doc_mask import document_ids

        logits = model(inputs.to(device), doc_ids=document_ids(inputs, eos_id).to(device))
    else:
        logits = model(inputs.to(device))
    logits = logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), labels.to(device).flatten(), reduction="none")
    nll = (nll.view_as(mask.to(device)) * mask.to(device)).double().sum(dim=1)
    return [(float(v), int(c)) for v, c in zip(nll.cpu(), mask.sum(dim=1))]
