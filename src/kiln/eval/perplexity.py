"""Held-out loss, perplexity and bits per byte."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kiln.data.loader import eval_batches, masking_eos_id
from kiln.data.shards import load_index, load_token_bytes, load_unigram_bits
from kiln.eval import perplexity_of
from kiln.eval.concentration import KEYS, measured_stride, score_positions
from kiln.eval.window_losses import gather_window_losses
from kiln.model.doc_mask import document_ids
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
    unigram_baseline: bool = True,
    doc_mask: bool = False,
    details: bool = False,
    next_token_positions: int = 65_536,
) -> dict[str, Any]:
    """Mean next-token loss over deterministic windows of `split`.

    Bits per byte divides the summed loss (in bits) by the UTF-8 bytes the scored tokens
    stand for (EOS: none); it compares models with different tokenizers, which loss per
    token does not. Shards from before Kiln saved each token's bytes fall back to the
    split's bytes-per-token ratio, which is exact only for a pass over the whole split.
    `unigram_bpb_scored` is the unigram baseline's bits per byte on exactly the tokens
    scored (a part of the split, with `max_batches`, is compared with its own baseline;
    `unigram_baseline=False` skips it, as periodic validation does). `doc_mask` (the run's
    `model.doc_mask`) masks attention by document as training did, so the losses compare.

    `details` (`kiln eval`; the model unwrapped, a `Transformer`): the same forward also
    gives the next-token concentration means (`kiln.eval.concentration`, under
    "next_token", over about `next_token_positions` positions of evenly spaced windows; 0:
    not measured; over the tokenizer's ids, renormalised) and each window's mean loss in
    window order (under "window_losses", a float64 array on rank 0 alone; the caller writes
    it beside eval.json), the first summed over the ranks, the second gathered. A model
    without `hidden_states` and `head` (a stand-in that returns a loss alone) gives neither.
    """
    env = env or DistEnv()
    index = load_index(token_dir)
    info = index[split]
    byte_lengths = load_token_bytes(token_dir)
    if byte_lengths is not None:
        byte_lengths = torch.from_numpy(byte_lengths).to(device)
    baseline = load_unigram_bits(token_dir) if unigram_baseline else None
    if baseline is not None:
        baseline = torch.from_numpy(baseline).to(device, torch.float64)
    eos = masking_eos_id(token_dir, doc_mask)
    details = details and hasattr(model, "hidden_states") and hasattr(model, "head")
    was_training = model.training
    model.eval()
    batches = eval_batches(token_dir, split, seq_len, batch_size, max_batches, env.rank,
                           env.world_size)
    # sharded models need every rank in every forward: pad short ranks with ignored batches
    rounds = int(all_reduce_max(torch.tensor(len(batches), device=device), env))
    # summed nats, tokens, bytes, and the unigram baseline's bits on the same tokens
    # (then, with `details`, the concentration sums and the positions they were taken on)
    stride = measured_stride(batches.scored_windows, seq_len, next_token_positions) if details else 0
    total = torch.zeros(4 + (len(KEYS) + 1) * details, dtype=torch.float64, device=device)
    # this rank's windows' mean losses, batch after batch (8 bytes a window; rank 0 gathers
    # them into the split's order at the end)
    windows = torch.zeros(batches.rank_slots if details else 0, dtype=torch.float64,
                          device=device)
    read = iter(batches)
    for i in range(rounds):
        real = i < len(batches)
        batch = (next(read) if real else torch.zeros(1, seq_len + 1, dtype=torch.long)).to(device)
        targets = batch[:, 1:]
        with autocast(device, precision):
            docs = None if eos is None else document_ids(batch[:, :-1], eos)
            masked = {} if docs is None else {"doc_ids": docs}  # off: the plain call
            if details:
                hidden = model.hidden_states(batch[:, :-1], None, docs)
                measured = torch.zeros(len(batch), dtype=torch.bool, device=device)
                if real and stride:  # windows by their place in the split: any rank count
                    first = batches.batch_ids[i] * batch_size
                    measured = torch.arange(first, first + len(batch), device=device) % stride == 0
                nats, sums = score_positions(hidden.flatten(0, 1), model.head.weight,
                                             targets.flatten(),
                                             measured=measured.repeat_interleave(seq_len),
                                             vocab_size=index["vocab_size"])
                sums = torch.cat([sums, (measured.sum() * seq_len).double().view(1)])
                mean_loss = nats.double().mean()
            else:
                mean_loss = model(batch[:, :-1], targets=targets, **masked)
        if not real:
            continue
        n = targets.numel()
        if details:
            windows[i * batch_size : i * batch_size + len(batch)] = (
                nats.view(len(batch), -1).double().mean(1))
        n_bytes = byte_lengths[targets].sum() if byte_lengths is not None else torch.zeros(())
        unigram = baseline[targets].sum() if baseline is not None else torch.zeros(())
        counts = torch.stack([mean_loss.double() * n, torch.tensor(n, device=device),
                              n_bytes.to(device, torch.float64), unigram.to(device, torch.float64)])
        total += torch.cat([counts, sums]) if details else counts
    model.train(was_training)
    summed = all_reduce_sum(total, env).tolist()
    nats, tokens, bytes_covered, unigram_bits = summed[:4]
    if tokens == 0:
        raise ValueError(f"split '{split}' has no complete window of {seq_len + 1} tokens")
    loss = nats / tokens
    exact = byte_lengths is not None
    if not exact:
        bytes_covered = tokens * info["bytes"] / info["tokens"]
    scored_baseline = {}
    if baseline is not None and exact and bytes_covered:
        scored_baseline["unigram_bpb_scored"] = unigram_bits / bytes_covered
    measured_positions = int(summed[-1]) if details else 0
    if measured_positions:
        scored_baseline["next_token"] = {
            **dict(zip(KEYS, (s / measured_positions for s in summed[4:-1]))),
            "positions": measured_positions,
            # over the tokenizer's ids, renormalised (a padded model vocabulary's others not)
            "tokenizer_ids": min(int(index["vocab_size"]), model.head.weight.shape[0])}
    if details:  # every rank: collectives; the array on rank 0 alone
        gathered = gather_window_losses(windows, batches, env)
        if gathered is not None:
            scored_baseline["window_losses"] = gathered
    return {
        "split": split,
        "loss": loss,
        "perplexity": perplexity_of(loss),
        "bpb": nats / math.log(2) / bytes_covered if bytes_covered else math.nan,
        "tokens": int(tokens),
        "bytes": int(bytes_covered) if exact else round(bytes_covered, 1),
        "bytes_counted": "exact" if exact else "estimated from the split's bytes per token",
        **scored_baseline,
    }
