"""The single-device model made ready for the ranks, in DESIGN's fixed order (activation
checkpointing: none yet; compile; then DDP or FSDP2), and the plain model found inside it again.

Why its own: model code is single-device code and parallelism is applied from outside;
this is that outside, apart from the process group and its collectives (`distributed`).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from kiln.parallel.distributed import DistEnv
from kiln.parallel.meta_init import InitPlan, materialize


def parallelize(model: nn.Module, kind: str, env: DistEnv, compile: bool = False,
                device: torch.device | None = None, init: InitPlan | None = None) -> nn.Module:
    """The single-device model, made ready to train on `device` (None: where it is): in
    DESIGN's fixed order, (activation checkpointing: none yet), torch.compile when asked,
    then DDP or FSDP2 over the ranks.

    FSDP2 moves each block to the device as it shards it, so a model to be sharded is left
    where it was made: moved whole first, every GPU would hold all its fp32 weights at once,
    which the 1/world_size share `memory_fit` checks does not cover (a model of ~20B
    parameters and up on 8 x 80 GB failed in `.to()` with an allocator traceback).

    A model built by `meta_init.build_on_meta` comes with its `init`: its weights are made
    on `device` (default: the CPU) before DDP, and into each rank's shards after FSDP2
    shards it, so no rank holds the whole model on the host (a GPU run: no CPU copy first)."""
    sharded = kind == "fsdp" and env.distributed
    if init is not None:
        device = device or torch.device("cpu")
        if not sharded:
            materialize(model, init, device)
    elif device is not None and not sharded:
        model.to(device)
    wrapped = wrap_model(torch.compile(model) if compile else model, kind, env, device)
    if init is not None and sharded:
        materialize(unwrap(wrapped), init, device, outer=wrapped)
    return wrapped


def wrap_model(model: nn.Module, kind: str, env: DistEnv,
               device: torch.device | None = None) -> nn.Module:
    """DDP replicates the model; FSDP2 shards each block, with the embedding, final norm
    and head (tied weights live there) in the root unit, on a mesh of `device`'s type
    (default: where the model's weights are)."""
    if not env.distributed:
        return model
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # the mesh named: FSDP2's default is the machine's accelerator, so a CPU run
        # (train.device = 'cpu', gloo) on a GPU machine had its weights moved to cuda:0
        kind_here = (device or next(model.parameters()).device).type
        mesh = init_device_mesh(kind_here, (env.world_size,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    raise ValueError(f"unknown parallel mode '{kind}'")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP and torch.compile wrappers."""
    while True:
        # not `a or b`: truth-testing a compiled module calls its __len__, which raises
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def grad_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulation."""
    if enabled:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2

        @contextlib.contextmanager
        def _off():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return _off()
    return contextlib.nullcontext()
