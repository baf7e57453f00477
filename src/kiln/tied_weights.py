"""Tied parameters (one Parameter under two names: a tied head is the embedding) in loaded
weights: every load path (checkpoint, native export, meta-built model) fills them in and
checks them here, alike.

A file stores a tied parameter once (safetensors holds no aliases), under its first name; the
other names are filled in from it. A file that holds both names was made by a model where
they were two parameters: if they are equal it is taken as it is, but if they differ, tying
them would silently drop one of the two trained tensors (the head became the embedding), so
the load is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kiln.errors import CheckpointError


def ties(model: nn.Module) -> list[tuple[str, str]]:
    """(name, the first name of the same parameter) for every parameter name."""
    first: dict[int, str] = {}
    return [(name, first.setdefault(id(p), name))
            for name, p in model.named_parameters(remove_duplicate=False)]


def tie_again(model: nn.Module, tied: list[tuple[str, str]]) -> None:
    """Point each name of a tied parameter at the first name's Parameter again."""
    for name, same_as in tied:
        if name != same_as:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._parameters[leaf] = model.get_parameter(same_as)


def with_ties(model: nn.Module, state: dict[str, torch.Tensor],
              source: Path | str) -> dict[str, torch.Tensor]:
    """`state` (read from file `source`) with each other name of a parameter `model` ties
    given the tensor of its first name; where `state` has both names and they differ, a
    CheckpointError naming `source`. A name whose first is not in `state` is left as it is
    (the fit check names what is missing)."""
    out = dict(state)
    for name, same_as in ties(model):
        if name == same_as or same_as not in out:
            continue
        first = out[same_as]
        if name in out and not _same(out[name], first):
            raise CheckpointError(
                f"{source}: its {name} is not tied to its {same_as} (they differ), but this "
                "model ties the two: the config's model.tie_embeddings = true does not match "
                "how these weights were trained; load them with model.tie_embeddings = false "
                f"(tied, the trained {name} would be dropped)")
        out[name] = first
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and torch.equal(a, b.to(a.dtype)))
