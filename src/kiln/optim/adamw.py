"""AdamW with decoupled weight decay applied only to matrices."""

from __future__ import annotations

import torch
from torch import nn

from kiln.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D weights (linear layers, embeddings); never norms, gains or biases."""
    decay, no_decay = [], []
    for p in model.parameters():  # .parameters() yields tied weights once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer `cfg.name` names: 'adamw', or 'muon' (Muon on hidden matrices and
    AdamW on the rest, in one optimizer; see kiln.optim.muon)."""
    if cfg.name == "muon":
        from kiln.optim.muon import build_muon

        return build_muon(model, cfg)
    if cfg.name != "adamw":
        raise ValueError(f"optim.name '{cfg.name}' is not implemented")
    from torch.distributed.tensor import DTensor

    # the fused kernel exists for CPU and CUDA and is bitwise-deterministic; DTensor
    # parameters (FSDP2) need the foreach path
    is_dtensor = any(isinstance(p, DTensor) for p in model.parameters())
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=not is_dtensor,
    )
