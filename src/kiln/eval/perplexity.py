"""Held-out loss, perplexity and bits per byte."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from kiln.data.loader import eval_batches
from kiln.data.shards import load_index
from kiln.parallel.distributed import DistEnv, all_reduce_max, all_reduce_sum
from kiln.train.precision import autocast


@torch.no_grad()
def evaluate(
    model: nn.Module,
    token_dir: Path,
    split: str,
    seq_len: int,
    batch_size: int,
    max_batches: int,
    device: torch.device,
    precision: str,
    env: DistEnv | None = None,
) -> dict[str, float]:
    """Mean next-token loss over deterministic windows of `split`.

    Bits per byte divides the summed loss (in bits) by the UTF-8 bytes those tokens stand
    for, estimated with the split's bytes-per-token ratio; it compares models with
    different tokenizers, which loss per token does not.
    """
    env = env or DistEnv()
    info = load_index(token_dir)[split]
    was_training = model.training
    model.eval()
    batches = list(eval_batches(token_dir, split, seq_len, batch_size, max_batches,
                                env.rank, env.world_size))
    # sharded models need every rank in every forward: pad short ranks with ignored batches
    rounds = int(all_reduce_max(torch.tensor(len(batches), device=device), env))
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed nats, token count
    for i in range(rounds):
        real = i < len(batches)
        batch = (batches[i] if real else torch.zeros(1, seq_len + 1, dtype=torch.long)).to(device)
        with autocast(device, precision):
            mean_loss = model(batch[:, :-1], targets=batch[:, 1:])
        if not real:
            continue
        n = batch[:, 1:].numel()
        total += torch.stack([mean_loss.double() * n, torch.tensor(n, device=device)])
    model.train(was_training)
    nats, tokens = all_reduce_sum(total, env).tolist()
    if tokens == 0:
        raise ValueError(f"split '{split}' has no complete window of {seq_len + 1} tokens")
    loss = nats / tokens
    bytes_covered = tokens * info["bytes"] / info["tokens"]
    return {
        "split": split,
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bpb": nats / math.log(2) / bytes_covered,
        "tokens": int(tokens),
    }
