"""Refuse, before any work, a model whose training state cannot fit in memory.

A model that does not fit otherwise fails after the data stages, in the middle of building
the model (an allocator traceback), or is killed by the kernel with no message at all. The
check counts only what training certainly holds: fp32 weights and gradients and the
optimizer's state (AdamW: two moments; Muon: one momentum, at the least), and, where the
trainer gives the tokens of a micro-batch, the activations every layer certainly keeps for
backward, so a refusal is never a false alarm; fragmentation and scratch come on top.
Without the activations a small model at a long context was taken and then killed: dim 256,
4 layers, 8 x 512 tokens counted 64 MB of state and peaked 866 MB above it on CPU.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from kiln.errors import ConfigError
from kiln.free_memory import host_memory_available

# bytes per parameter: fp32 weight + fp32 gradient + optimizer state (a lower bound)
STATE_BYTES = {"adamw": 16, "muon": 12}
GIB = 1 << 30


def count_model_params(model_cfg) -> int:
    """Parameters of the model `model_cfg` builds, counted on the meta device (no memory)."""
    from kiln.model.transformer import Transformer, count_params

    with torch.device("meta"):
        return count_params(Transformer(model_cfg))["params"]


def activation_bytes(model_cfg, tokens: int, precision: str) -> int:
    """Bytes of activations the layers certainly hold at the end of a micro-batch's forward
    (a lower bound: attention, routed experts and the loss keep more). Per token and layer:
    each RMSNorm's fp32 normalised input and its output (the next linear's input, in the
    compute dtype), the output projection's input, and the SwiGLU gate output and down
    projection input (an MoE layer: its shared experts' only)."""
    from kiln.model.transformer import expert_hidden_size, ffn_hidden_size, head_dim, is_moe_layer

    size = 2 if precision == "bf16" else 4
    dim = model_cfg.dim
    total = 0
    for i in range(model_cfg.n_layers):
        hidden = (model_cfg.n_shared * expert_hidden_size(model_cfg)
                  if is_moe_layer(model_cfg, i) else ffn_hidden_size(model_cfg))
        total += 2 * dim * 4 + size * (2 * dim + model_cfg.n_heads * head_dim(model_cfg)
                                       + 2 * hidden)
    return total * tokens


def device_memory_available(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        return host_memory_available()
    return None


def check_training_fits(model_cfg, optim_name: str, device: torch.device, parallel: str = "ddp",
                        world_size: int = 1, available: int | None = None,
                        planned_vocab: int | None = None, tokens: int = 0,
                        precision: str = "fp32") -> None:
    """Raise ConfigError when the training state alone exceeds the memory there is.

    Per device: a DDP rank holds all of it, an FSDP rank its 1/world_size share; the ranks
    of one host share its memory on CPU (torchrun's LOCAL_WORLD_SIZE of them).
    `planned_vocab`: the vocabulary is the tokenizer's, not trained yet (it may learn fewer
    tokens than asked): `model_cfg` carries the fewest it can have, which decides, and the
    message also gives the count with the planned size.
    `tokens`: a micro-batch's (micro_batch x seq_len), 0 for the state alone. From the
    second step the weights and optimizer state sit beside the forward's activations (the
    gradients, set to None, come back as backward frees them): the larger of gradients and
    activations counts."""
    params = count_model_params(model_cfg)
    per_rank = params * STATE_BYTES.get(optim_name, STATE_BYTES["adamw"])
    if parallel == "fsdp" and world_size > 1:
        per_rank //= world_size
    grads = params * 4 // (world_size if parallel == "fsdp" and world_size > 1 else 1)
    acts = activation_bytes(model_cfg, tokens, precision)
    per_rank += max(0, acts - grads)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    need = per_rank * ranks_here
    available = device_memory_available(device) if available is None else available
    if available is None or need <= available:
        return
    where = "this machine's free memory" if device.type == "cpu" else f"{device}'s free memory"
    sharing = f" ({ranks_here} ranks on this host)" if ranks_here > 1 else ""
    if planned_vocab:
        planned = count_model_params(dataclasses.replace(model_cfg, vocab_size=planned_vocab))
        size = (f"{_count(planned)} parameters with the planned {planned_vocab:,}-token "
                f"vocabulary ({_count(params)} with the smallest a tokenizer can have)")
        shrink = "[model] dim, n_layers, ffn_hidden, n_experts"  # the vocabulary is not it
    else:
        size = f"{_count(params)} parameters"
        shrink = "[model] dim, n_layers, ffn_hidden, n_experts, vocab_size"
    raise ConfigError(
        f"the model has {size}: training it needs at least "
        f"{need / GIB:.1f} GiB for fp32 weights, gradients and {optim_name} state"
        + (f" and a micro-batch's activations ({acts / GIB:.1f} GiB)" if acts > grads else "")
        + f"{sharing}, more than {where} ({available / GIB:.1f} GiB); make the "
        f"model smaller ({shrink}"
        + (", or train.micro_batch / train.seq_len" if acts > grads else "") + "), "
        + ("shard it over more GPUs (train.parallel = 'fsdp'), " if device.type == "cuda" else "")
        + "or use a larger machine")


def _count(params: int) -> str:
    """A parameter count as read: 25.72B, 4.03M; a tiny model refused for its micro-batch's
    activations had "0.00B parameters"."""
    if params >= 10**8:
        return f"{params / 1e9:.2f}B"
    return f"{params / 1e6:.2f}M" if params >= 10**4 else f"{params:,}"
