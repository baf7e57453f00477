"""Loss-free expert load balancing: a per-expert bias that only steers top-K selection.

Two update rules, applied once per optimizer step from the token counts n_i routed to each
expert since the previous update:

* ``sign`` — DeepSeek-V3's auxiliary-loss-free rule, ``b_i += gamma * sign(nbar - n_i)``,
  followed by re-centering ``b -= mean(b)`` as Trinity Nano/Mini do.
* ``smebu`` — Trinity Large's smooth, momentum-damped rule (SMEBU)::

      v = (nbar - n) / nbar            # > 0 for underloaded experts
      u = lam * tanh(kappa * v)
      u = u - mean(u)
      m = beta * m + (1 - beta) * u
      b = b + m

  defaults lam=5e-4, beta=0.5, kappa=2. Since every u is zero-mean, so are m and b, and
  |m_i| <= 2 * lam (|u_i| <= 2 * lam after centering; m is a convex mix of u's).

Both rules are invariant to scaling all counts by a constant, so counting a layer twice
under activation-checkpoint recomputation leaves the update unchanged.

Under data parallelism the trainer passes a reduction (from ``kiln.parallel``) that sums
the counts over ranks, so every rank applies the same update and the bias stays
replicated; the model itself stays single-device code.
Bias and momentum are fp32 *buffers*: no gradient, no weight decay, saved with the model's
state dict (and identical on every rank, so DDP's buffer broadcast is harmless).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

BALANCE_RULES = ("smebu", "sign", "none")


def sign_rule_delta(counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """DeepSeek-V3 step ``gamma * sign(nbar - n)``, centred to zero mean (re-centering),
    in fp64, over the last dimension."""
    n = counts.to(torch.float64)
    delta = gamma * torch.sign(n.mean(-1, keepdim=True) - n)
    return delta - delta.mean(-1, keepdim=True)


def smebu_step(
    counts: torch.Tensor, momentum: torch.Tensor, lam: float, beta: float, kappa: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SMEBU update; returns (bias increment, new momentum), both in momentum's dtype.
    Works on the last dimension, so leading dimensions batch independent layers/runs."""
    n = counts.to(momentum.dtype)
    nbar = n.mean(-1, keepdim=True)
    v = (nbar - n) / nbar
    u = lam * torch.tanh(kappa * v)
    u = u - u.mean(-1, keepdim=True)
    m = beta * momentum + (1.0 - beta) * u
    return m, m


def max_violation(counts: torch.Tensor) -> float:
    """MaxVio = (max(n) - nbar) / nbar, the load-imbalance figure of DeepSeek / Trinity."""
    n = counts.double()
    nbar = n.mean()
    return float((n.max() - nbar) / nbar) if nbar > 0 else 0.0


class ExpertBiasBalancer(nn.Module):
    """Holds one MoE layer's selection bias and applies the chosen update rule.

    ``record(counts)`` adds a forward pass's per-expert token counts (call it for every
    micro-batch); ``update()`` (once per optimizer step) reduces the pending counts across
    ranks, moves the bias, and clears them.
    """

    def __init__(
        self,
        n_experts: int,
        rule: str = "smebu",
        rate: float = 5e-4,
        smebu_beta: float = 0.5,
        smebu_kappa: float = 2.0,
    ):
        super().__init__()
        if rule not in BALANCE_RULES:
            raise ValueError(f"balance rule must be one of {BALANCE_RULES}, got '{rule}'")
        if rate < 0:
            raise ValueError(f"balance_rate must be >= 0, got {rate}")
        if not 0.0 <= smebu_beta < 1.0:
            raise ValueError(f"smebu_beta must be in [0, 1), got {smebu_beta}")
        if smebu_kappa <= 0:
            raise ValueError(f"smebu_kappa must be > 0, got {smebu_kappa}")
        self.rule, self.rate = rule, rate
        self.beta, self.kappa = smebu_beta, smebu_kappa
        self.register_buffer("bias", torch.zeros(n_experts, dtype=torch.float32))
        self.register_buffer("momentum", torch.zeros(n_experts, dtype=torch.float32))
        # A plain attribute, not a buffer: DDP re-broadcasts rank 0's buffers before every
        # forward, which would overwrite each rank's own counts. Checkpoints are taken after
        # update() has cleared them, so nothing is lost by not saving them.
        self.pending_counts = torch.zeros(n_experts, dtype=torch.int64)

    def record(self, counts: torch.Tensor) -> None:
        if self.pending_counts.device != counts.device:
            self.pending_counts = self.pending_counts.to(counts.device)
        self.pending_counts += counts.detach().to(self.pending_counts.dtype)

    @torch.no_grad()
    def update(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Apply one bias update from the pending counts, summed over ranks by `reduce`
        (None: this process's alone); returns the counts used."""
        counts = self.pending_counts.clone()
        if reduce is not None:
            counts = reduce(counts)
        self.pending_counts.zero_()
        if self.rule == "none" or int(counts.sum()) == 0:
            return counts
        if self.rule == "sign":
            self.bias += sign_rule_delta(counts, self.rate).to(self.bias.dtype)
            self.bias -= self.bias.mean()
        else:
            delta, m = smebu_step(counts, self.momentum, self.rate, self.beta, self.kappa)
            self.momentum.copy_(m)  # in place: wrappers may hold references to the buffer
            self.bias += delta
        return counts

    def extra_repr(self) -> str:
        return f"rule={self.rule}, rate={self.rate}, beta={self.beta}, kappa={self.kappa}"
