"""Build a model with its parameters on the meta device, then initialise them where they end
up (a device, an FSDP2 shard) with the weights an ordinary CPU build gives for the same seed.

Built on the CPU, every rank of a launch held the whole fp32 model in host memory before
DDP / FSDP2 took it (8 ranks of a 7B model: ~224 GB per node), and an FSDP2 rank then kept
1/world of it. Here the constructor runs with parameters on the meta device (buffers and
plain attributes are made as usual: they are small, and some are computed, not drawn) while
every in-place write to a meta tensor is recorded: `nn.init.*` in the constructors and in
`reset_parameters`, in the order they ran. `InitPlan.replay` then runs the same ops, in the
same order, on the CPU's default generator from the state it had at the build: one parameter
at a time, each written into its place (the parameter itself on the CPU, a copy to a GPU, the
rank's chunk of an FSDP2 shard), so the draws, and so the weights and the generator's state
after them, are bitwise those of the CPU build, and a rank never holds more than one full
parameter beyond its own. Draws into tensors the model no longer holds (an `nn.Linear`'s
default init, a tied head's own weight) are replayed too: they move the generator.

What cannot be replayed so (a random op that makes a new tensor, an init that writes part of
a parameter, an in-place op that reads another meta tensor, a buffer or tensor attribute
computed from a parameter) is refused when the model is built, naming the op or the tensor:
build such a model on the CPU.

A model whose every weight is then loaded (eval, generate, export) needs no init at all:
`assign_weights` gives its meta parameters the loaded tensors themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.tied_weights import tie_again, ties, with_ties

META = torch.device("meta")

# in-place ops that overwrite their target whatever it held (a chain starts with one)
_OVERWRITES = {torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor,
               torch.ops.aten.zero_.default, torch.ops.aten.copy_.default}


@dataclass
class _Write:
    """One run of in-place ops on one tensor, in the order they ran."""
    target: torch.Tensor  # the meta tensor written (held: matched to a parameter later)
    ops: list[tuple[Any, tuple, dict]] = field(default_factory=list)
    name: str | None = None  # the parameter it is, once the model is built (None: dropped)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[_Write] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        in_place = any(a.alias_info is not None and a.alias_info.is_write
                       for a in func._schema.arguments)
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is not None and target.device == META and in_place:
            self._record(func, args, kwargs, target, seeded)
        elif seeded:  # a draw the replay could not put back in its place in the stream
            raise NotImplementedError(
                f"{func} draws random numbers while the model is built with its parameters on "
                "the meta device, other than in place into a parameter (nn.init.*): it cannot "
                "be replayed in order; build this model on the CPU")
        return func(*args, **kwargs)

    def _record(self, func, args: tuple, kwargs: dict, target: torch.Tensor, seeded: bool) -> None:
        starts = seeded or func in _OVERWRITES  # the target's old values do not matter
        if not starts and not (self.writes and self.writes[-1].target is target):
            raise NotImplementedError(
                f"{func} changes a meta tensor in place from what it held: only writes that "
                "set a whole tensor (nn.init.*), and ops on it right after them, can be "
                "replayed; build this model on the CPU")
        meta_inputs = [a for a in (*args[1:], *kwargs.values())
                       if isinstance(a, torch.Tensor) and a.device == META]
        if meta_inputs or kwargs.get("generator") is not None:
            raise NotImplementedError(
                f"{func} writes a meta tensor from another meta tensor or with a generator of "
                "its own: it cannot be replayed; build this model on the CPU")
        if starts:
            self.writes.append(_Write(target))
        # a tensor read (a copy_'s source) as it is now: the build may change it afterwards
        kept = [a.clone() if isinstance(a, torch.Tensor) else a for a in (*args[1:], *kwargs.values())]
        self.writes[-1].ops.append((func, tuple(kept[:len(args) - 1]),
                                    dict(zip(kwargs, kept[len(args) - 1:]))))


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered meanwhile is moved to the meta device (its CPU tensor,
    made by `torch.empty` and never written, is dropped at once); buffers stay as made."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device != META:  # a meta one: tied, kept as it is
            param = type(param)(param.to(META), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


@dataclass
class InitPlan:
    """The recorded init of a model built by `build_on_meta`: replay it once its parameters
    have their places (`materialize`)."""
    writes: list[_Write]
    rng_state: torch.Tensor  # the CPU generator's state when the build began

    def replay(self, model: nn.Module) -> None:
        """Run the recorded writes into `model`'s parameters (found by name: wrappers may
        have replaced the objects), from the generator state of the build; the generator is
        left where the CPU build would have left it."""
        torch.set_rng_state(self.rng_state)
        with torch.no_grad():
            for write in self.writes:
                dest = model.get_parameter(write.name) if write.name else None
                _replay_one(write, dest)


def build_on_meta(build: Callable[[], nn.Module]) -> tuple[nn.Module, InitPlan]:
    """`build()` with its parameters on the meta device, and the plan that initialises them
    as a CPU build would have (see the module's docstring)."""
    rng_state = torch.get_rng_state()
    recorder = _Recorder()
    with _parameters_on_meta(), recorder:
        model = build()
    if not torch.equal(torch.get_rng_state(), rng_state):  # draws on meta take none from it
        raise NotImplementedError(
            "the model's build set the CPU generator (torch.manual_seed or set_rng_state in a "
            "constructor): the draws after it cannot be replayed from the state the build began "
            "with; build this model on the CPU")
    names: dict[int, str] = {}
    storages: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
        storages.setdefault(p.untyped_storage()._cdata, name)
    written: set[str] = set()
    for write in recorder.writes:
        write.name = names.get(id(write.target))
        part_of = storages.get(write.target.untyped_storage()._cdata)
        if write.name is None and part_of is not None:
            raise NotImplementedError(f"the init writes part of parameter '{part_of}' in place: "
                                      "it cannot be replayed; build this model on the CPU")
        if write.name is not None:
            written.add(write.name)
    unset = [n for n, _ in model.named_parameters() if n not in written]
    if unset:
        raise NotImplementedError(f"parameter '{unset[0]}' is not set by an in-place init "
                                  "(its value came with its tensor): build this model on the CPU")
    computed = _tensors_on_meta(model)
    if computed:
        raise NotImplementedError(f"'{computed[0]}' is computed from a parameter while the model "
                                  "is built with its parameters on the meta device, where they "
                                  "hold no values: build this model on the CPU")
    return model, InitPlan(recorder.writes, rng_state)


def _tensors_on_meta(model: nn.Module) -> list[str]:
    """Buffers and plain tensor attributes left on the meta device: made from a parameter
    (a buffer of its norms); `materialize` could not restore them, and a plain attribute
    would stay without values, failing only where it is used."""
    found = []
    for owner, module in model.named_modules():
        held = [*module._buffers.items(),
                *((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor))]
        found += [f"{owner}.{name}" if owner else name for name, t in held
                  if isinstance(t, torch.Tensor) and t.device == META]
    return found


def materialize(model: nn.Module, plan: InitPlan, device: torch.device,
                outer: nn.Module | None = None) -> None:
    """Give `model`'s meta parameters storage on `device` (an FSDP2 model: its shards only)
    and replay `plan` into them; buffers keep the values they were made with. `outer`: a
    wrapper of `model` (torch.compile's) that FSDP2 made its root: its hook takes in the
    root's new shards at once (else only at the first forward).

    A parameter added to the model after its build has no recorded init: on the meta device
    it is refused, naming it (to_empty would leave it uninitialised memory, trained as
    weights without a word); one given values (not on the meta device) keeps them, as
    buffers do."""
    _refuse_unplanned(model, plan)
    buffers = dict(model.named_buffers())
    given = {n: p.detach().clone() for n, p in model.named_parameters() if p.device != META}
    tied = ties(model)
    (model if outer is None else outer).to_empty(device=device)
    tie_again(model, tied)  # to_empty gives each name a tensor of its own
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        for name, values in given.items():
            model.get_parameter(name).copy_(values)
    plan.replay(model)


def _refuse_unplanned(model: nn.Module, plan: InitPlan) -> None:
    """A meta parameter that no recorded write names, under any of its names (tied)."""
    planned = {w.name for w in plan.writes if w.name}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.device == META:
            names.setdefault(id(p), []).append(name)
    for held in names.values():
        if not planned.intersection(held):
            raise RuntimeError(
                f"parameter '{held[0]}' is on the meta device with no recorded init: it was "
                "added after `build_on_meta` built the model, and `materialize` would leave it "
                "uninitialised memory; make it in the model's constructor, or give it values "
                "(a tensor not on the meta device) before materializing")


def assign_weights(model: nn.Module, state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Give a model built by `build_on_meta` the tensors of `state` (a loaded checkpoint or
    export, read from file `source`) as its parameters and persistent buffers: no init is
    replayed and nothing is copied, so a loaded model costs its weights once, not a random
    model beside them. `load_state_dict(strict=True, assign=True)`: a missing, unexpected or
    mis-shaped tensor gets torch's own error, as the copy into a built model did. A tensor of
    another dtype is cast to its parameter's first, as that copy cast it (assign would hand
    the model the file's dtype); tied parameters are filled in, and checked, by
    `tied_weights.with_ties`, then tied again (assign gives each name its own)."""
    own = {k: v.dtype for k, v in model.state_dict().items()}
    state = {k: v.to(own[k]) if k in own and v.dtype != own[k] else v
             for k, v in with_ties(model, state, source).items()}
    tied = ties(model)
    model.load_state_dict(state, strict=True, assign=True)
    tie_again(model, tied)


def _replay_one(write: _Write, dest: torch.Tensor | None) -> None:
    """One run of ops, into `dest` itself where it is the CPU tensor the build would have
    written, else into a CPU tensor of the target's layout copied to where `dest` lives."""
    t = write.target
    direct = (dest is not None and not _is_dtensor(dest) and dest.device.type == "cpu"
              and dest.dtype == t.dtype and dest.shape == t.shape and dest.stride() == t.stride())
    canvas = dest if direct else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    for func, args, kwargs in write.ops:
        func(canvas, *args, **kwargs)
    if dest is None or direct:
        return
    if _is_dtensor(dest):
        local = dest.to_local()
        piece = _local_piece(canvas, dest)
        if piece.shape != local.shape:
            raise RuntimeError(f"parameter '{write.name}': its shard is {tuple(local.shape)}, "
                               f"the chunk of {tuple(canvas.shape)} for this rank "
                               f"{tuple(piece.shape)}")
        local.copy_(piece)
    else:
        dest.copy_(canvas)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def _local_piece(full: torch.Tensor, dtensor: Any) -> torch.Tensor:
    """This rank's part of `full` under `dtensor`'s placements: DTensor's Shard(d) is
    torch.chunk along d over the mesh dimension (ranks past the last chunk hold none)."""
    from torch.distributed.tensor import Shard

    mesh, piece = dtensor.device_mesh, full
    for dim, placement in enumerate(dtensor.placements):
        if isinstance(placement, Shard):
            chunks = piece.chunk(mesh.size(dim), dim=placement.dim)
            index = mesh.get_local_rank(dim)
            piece = chunks[index] if index < len(chunks) else piece.narrow(placement.dim, 0, 0)
        elif not placement.is_replicate():
            raise NotImplementedError(f"cannot place an init under {placement}")
    return piece
