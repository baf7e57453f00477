"""Next-token concentration: how much of the model's next-token probability sits on a few
tokens (papers/model-collapse.md, "Model-intrinsic collapse measures"). A model trained on
its own generations concentrates its mass; these figures rise (top-1, top-k mass) or fall
(k90, entropies) as it does.

The paper records the top-100 probabilities after each prompt; its exact statistic was not
recovered, so Kiln chose these, each averaged over every scored position (sums over the
positions of all ranks, divided by the positions counted; never a mean of per-rank means).
With p the softmax of a position's logits and p_(1) >= p_(2) >= ... its sorted entries:

- ``top1_prob``: p_(1) (the paper code's ``first_token_prob``);
- ``top5_mass``, ``top10_mass``: p_(1) + ... + p_(k) for k = 5, 10 (k capped at the vocabulary);
- ``k90``: the smallest k with p_(1) + ... + p_(k) >= 0.9 (running sums in fp32, as the
  softmax: a sum within ~1e-6 of 0.9 may land one rank either side; fp64 sums cost twice
  the sort);
- ``top100_entropy``: the entropy in nats of q_i = p_(i) / (p_(1) + ... + p_(100)),
  i <= 100 (0 ln 0 = 0): ln 100 for a flat distribution, 0 for a one-hot one;
- ``entropy``: the entropy in nats of p itself, over the whole vocabulary.

"The vocabulary" is the tokenizer's ids: a model whose vocabulary is padded past the
tokenizer's (model.vocab_size) has ids no text holds, and p is the softmax over the
tokenizer's ids alone (the distribution renormalised over them), as `kiln generate` samples
(`kiln.model.sampling.tokenizer_ids`): unused ids counted would add a tail of mass no token
can take (raising k90 and the entropy, lowering the top-k mass). eval.json records their
number as ``tokenizer_ids``.

The same logits give each position's loss -ln p_target, so `kiln eval` takes these figures
in its one forward pass (`score_positions`). The loss stays the full softmax's
cross-entropy, over every id the model has, as training's loss is (`kiln.model.fused_loss`).
"""

from __future__ import annotations

import numpy as np
import torch

from kiln.model.fused_loss import chunk_rows
from kiln.model.layers import compute_dtype
from kiln.model.sampling import tokenizer_ids

MASS_KS = (5, 10)
MASS_TARGET = 0.9
TOP_ENTROPY_K = 100
# eval.json's keys, in the order of `concentration_sums`' entries
KEYS = ("top1_prob", "top5_mass", "top10_mass", "k90", "top100_entropy", "entropy")


def _ranked(p: torch.Tensor) -> torch.Tensor:
    """Each row of `p` sorted, largest first. On the CPU through numpy, of -p ascending
    (no strided copy to reverse): torch's CPU sort of (1024 x 4096) fp32 rows took 150-400
    ms on the 2-core test machine, numpy's 18-28 ms."""
    if p.device.type != "cpu":
        return p.sort(dim=1, descending=True).values
    return torch.from_numpy(np.sort((-p).numpy(), axis=1)).neg_()


def concentration_sums(log_p: torch.Tensor) -> torch.Tensor:
    """The KEYS statistics of each row of `log_p` (N, V; log-softmaxed, fp32 or fp64),
    summed over the rows: a (6,) fp64 tensor; divide by N (over every rank) for the means."""
    p = log_p.exp()
    entropy = -(p * log_p).sum(1)  # 1.2 ms per 1024 x 4096 chunk; an einsum took 4.2
    ranked = _ranked(p)
    mass = ranked.cumsum(1)
    vocab = ranked.shape[1]
    top_k = [mass[:, min(k, vocab) - 1] for k in MASS_KS]
    # ranks still short of the target, plus the one that reaches it (the running sums never
    # fall: a binary search per row, 200x faster than counting them)
    target = torch.full((len(mass), 1), MASS_TARGET, dtype=mass.dtype, device=mass.device)
    k90 = (torch.searchsorted(mass, target)[:, 0] + 1).clamp(max=vocab)
    top = ranked[:, :TOP_ENTROPY_K]
    top_entropy = torch.special.entr(top / mass[:, top.shape[1] - 1 : top.shape[1]]).sum(1)
    rows = torch.stack([ranked[:, 0], *top_k, k90.to(p.dtype), top_entropy, entropy], 1)
    return rows.double().sum(0)


def score_positions(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    chunk: int | None = None, measured: torch.Tensor | None = None,
                    vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's loss in nats (N,) fp32 and the KEYS sums (6,) fp64 over the positions
    `measured` (N,) bool marks (None: all), from hidden states (N, D), the head's weight
    (V, D) and the targets (N,). The logits are made `chunk` rows at a time (as `fused_loss`
    does: the full N x V never exists), in the compute dtype the autocast would use, then
    upcast to fp32 for the log-softmax. The loss is over all V ids; the KEYS over the
    tokenizer's first `vocab_size` (None: all V), renormalised."""
    dtype = compute_dtype(hidden)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    acc = torch.promote_types(dtype, torch.float32)
    chunk = chunk or chunk_rows(weight.shape[0])
    losses = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
    sums = torch.zeros(len(KEYS), dtype=torch.float64, device=hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        for c0 in range(0, hidden.shape[0], chunk):
            c1 = min(c0 + chunk, hidden.shape[0])
            log_p = torch.log_softmax((hidden[c0:c1] @ weight.t()).to(acc), dim=1)
            losses[c0:c1] = -log_p.gather(1, targets[c0:c1, None].long())[:, 0]
            rows = log_p if measured is None else log_p[measured[c0:c1]]
            if len(rows):
                if vocab_size is not None and vocab_size < rows.shape[1]:
                    rows = torch.log_softmax(tokenizer_ids(rows, vocab_size), dim=1)
                sums += concentration_sums(rows)
    return losses, sums


def measured_stride(windows: int, seq_len: int, positions: int) -> int:
    """Every how many windows (by their place in the split, so the same windows whatever
    the ranks) the concentration is measured to cover about `positions` positions: the sort
    of each distribution costs far more than the loss (~10x the head's matmul at a 32k
    vocabulary), and a mean over tens of thousands of positions is already precise. 0: off."""
    if positions <= 0 or windows <= 0:
        return 0
    wanted = -(-positions // seq_len)  # windows of seq_len positions
    return max(1, -(-windows // wanted))


def concentration_text(means: dict[str, float]) -> str:
    """The figures on one line, for eval's summary."""
    over = [f"{means[key]:,} {what}" for key, what in
            (("positions", "positions"), ("tokenizer_ids", "tokenizer ids")) if key in means]
    return (f"top-1 p {means['top1_prob']:.4f}, top-5 mass {means['top5_mass']:.4f}, "
            f"top-10 mass {means['top10_mass']:.4f}, k for 90% mass {means['k90']:.1f}, "
            f"top-100 entropy {means['top100_entropy']:.4f} nats, "
            f"entropy {means['entropy']:.4f} nats" + (f" (over {', '.join(over)})" if over else ""))
