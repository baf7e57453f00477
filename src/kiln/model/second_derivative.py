"""A guard for Kiln's hand-written backwards (RMSNorm, RoPE, matmul attention, fused loss).

They compute from tensors saved in forward (normalised activations, probabilities, finished
gradients) that carry no graph back to the inputs, so differentiated a second time
(`create_graph=True`: gradient penalties, Hessian-vector products) they gave wrong numbers
without a word: RMSNorm's second derivative ~33% off, matmul attention's 0. Nothing in Kiln
needs one; refusing it names what to change instead.
"""

from __future__ import annotations

import torch


def refuse_second_derivative(name: str) -> None:
    """Raise if this backward runs with `create_graph=True` (grad mode is on in a backward
    only then). Skipped while compiling, where the trace is not a second derivative."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(f"{name}'s hand-written backward has no second derivative: a "
                           "backward with create_graph=True through it is refused (its result "
                           "would be wrong)")
