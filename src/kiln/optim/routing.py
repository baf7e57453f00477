"""Which parameters Muon updates and which stay on AdamW.

Muon's orthogonalised update is steepest descent for a matrix that maps hidden features to
hidden features. Embeddings (a lookup table, one row per token), the LM head, routers
(a few logits that must stay calibrated) and every vector or scalar (norm gains, biases)
are not such matrices, so they stay on AdamW (Keller Jordan's Muon; Trinity Large).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

HEAD_NAMES = ("head", "lm_head", "output")  # final module name of an LM head / classifier


@dataclass
class ParamRouting:
    """Parameters by optimizer, each as (name, parameter), and why each went where it went."""

    muon: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    adamw: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


def _owner_kinds(model: nn.Module) -> dict[int, set[str]]:
    """For each parameter (by identity): 'embedding' and/or 'head' if a module of that kind
    holds it. A tied head weight is held by both modules and is found through either."""
    kinds: dict[int, set[str]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        last = mod_name.rsplit(".", 1)[-1]
        for p in module.parameters(recurse=False):
            tags = kinds.setdefault(id(p), set())
            if isinstance(module, nn.Embedding):
                tags.add("embedding")
            if last in HEAD_NAMES:
                tags.add("head")
    return kinds


def route_parameters(model: nn.Module) -> ParamRouting:
    """Split the trainable parameters of `model` between Muon and AdamW.

    AdamW: names containing 'router', embeddings, the LM head, every tensor with ndim < 2.
    Muon: other 2-D weights (out, in) and 3-D expert stacks (experts, out, in).
    Every trainable parameter lands in exactly one list (checked); other shapes raise."""
    kinds = _owner_kinds(model)
    routing = ParamRouting()
    for name, p in model.named_parameters():  # tied weights appear once
        if not p.requires_grad:
            continue
        tags = kinds.get(id(p), set())
        if "router" in name:
            reason = "router"
        elif "embedding" in tags:
            reason = "embedding"
        elif "head" in tags:
            reason = "lm head"
        elif p.ndim < 2:
            reason = f"{p.ndim}-d tensor"
        elif p.ndim in (2, 3):
            reason = "hidden matrix" if p.ndim == 2 else "expert stack (E, out, in)"
            routing.muon.append((name, p))
            routing.reasons[name] = reason
            continue
        else:
            raise ValueError(
                f"parameter '{name}' has shape {tuple(p.shape)}: Muon handles 2-D weights and "
                "3-D expert stacks (E, out, in) only; add a routing rule for it"
            )
        routing.adamw.append((name, p))
        routing.reasons[name] = reason
    check_coverage(model, routing)
    return routing


def check_coverage(model: nn.Module, routing: ParamRouting) -> None:
    """Raise unless every trainable parameter is in exactly one of the two lists."""
    muon = {id(p) for _, p in routing.muon}
    adamw = {id(p) for _, p in routing.adamw}
    if len(muon) != len(routing.muon) or len(adamw) != len(routing.adamw):
        raise AssertionError("a parameter is listed twice in one optimizer")
    both = muon & adamw
    if both:
        raise AssertionError(f"{len(both)} parameter(s) routed to both Muon and AdamW")
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    missing = trainable - muon - adamw
    extra = (muon | adamw) - trainable
    if missing or extra:
        raise AssertionError(
            f"routing covers the model badly: {len(missing)} missing, {len(extra)} foreign"
        )
