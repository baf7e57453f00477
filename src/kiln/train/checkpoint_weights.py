"""The model's weights as a checkpoint holds them: gathered whole (fp32, on the CPU) from any
wrapping, a tied head stored once, loaded back strictly, and checked finite.

Why its own: eval, generate and export load weights without the rest of a checkpoint, and
the checkpoint callback checks every rank's shards are finite before it saves; how the
tensors are taken from and put into a model is one idea, apart from how a checkpoint's
files are written, pruned and read (`checkpoint`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from kiln.errors import CheckpointError, TrainingDiverged
from kiln.parallel.distributed import DistEnv, all_reduce_max
from kiln.parallel.meta_init import assign_weights
from kiln.parallel.model_wrapping import unwrap
from kiln.tied_weights import with_ties

# full (gathered) state dicts, offloaded to the CPU: the model's and the optimizer's
FULL_ON_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)



def _tied(model: nn.Module) -> bool:
    return bool(getattr(getattr(unwrap(model), "cfg", None), "tie_embeddings", False))


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (gathered) fp32 weights on CPU; a tied head is stored once, as the embedding."""
    state = get_model_state_dict(model, options=FULL_ON_CPU)
    if _tied(model):
        state.pop("head.weight", None)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def load_model_tensors(model: nn.Module, tensors: dict[str, torch.Tensor],
                       source: Path | str) -> None:
    """Load full weights (read from file `source`), refusing any missing, unexpected or
    differently shaped tensor (set_model_state_dict alone lets missing ones keep their random
    init), and a tied head that differs from its embedding (`with_ties`). A model built with
    its parameters on the meta device (`build_on_meta`) takes the tensors themselves."""
    tensors = with_ties(unwrap(model), tensors, source)
    own = unwrap(model).state_dict()
    expected = {k: (tuple(v.shape), v.dtype) for k, v in own.items()}
    got = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [f"{k}: {_described(got[k], want)} in the checkpoint, "
                 f"{_described(want, got[k])} in the model"
                 for k, want in expected.items() if k in got and got[k] != want]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems)} in all)" if len(problems) > 5 else "")
        # named: eval, generate, export and a resume each read another checkpoint's file
        raise CheckpointError(f"the checkpoint {source} does not fit this model ({shown}): it "
                              "was made with another [model] config (use the run's config, or "
                              "start over with `kiln train --fresh`), or the file was altered")
    if any(p.is_meta for p in model.parameters()):  # built by build_on_meta: no init to undo
        assign_weights(unwrap(model), tensors, source)
    else:
        set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True))


def _described(this: tuple[tuple[int, ...], torch.dtype],
               other: tuple[tuple[int, ...], torch.dtype]) -> str:
    """A tensor's shape, and its dtype where that is what differs from `other`'s."""
    shape, dtype = this
    return f"{shape}" if dtype == other[1] else f"{shape} {str(dtype).removeprefix('torch.')}"


def refuse_non_finite(tensors: dict[str, torch.Tensor], ckpt: Path) -> None:
    """A diverged model's weights hold NaN or inf: resuming from them, or exporting them,
    gives a model that only outputs NaN."""
    bad = [k for k, v in tensors.items() if not is_finite(v)]
    if bad:
        raise TrainingDiverged(f"{ckpt} holds non-finite weights ({', '.join(bad[:3])}"
                               f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}): the run "
                               "diverged before this checkpoint; move it out of checkpoints/ to "
                               "use the one before it")


def is_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in `t`. A float of 32 bits or fewer is summed in float64, which no
    finite values of it can overflow while NaN and inf carry through: one pass with no
    temporaries, where `isfinite(t).all()` wrote a bool per element (~100 MB for a 400 MB
    model's largest weight; half the time of loading a checkpoint)."""
    if not t.is_floating_point():
        return True
    if t.element_size() <= 4:
        return bool(torch.isfinite(t.sum(dtype=torch.float64)))
    return bool(torch.isfinite(t).all())


def weights_are_finite(model: nn.Module, env: DistEnv) -> bool:
    """Every rank's shard of every weight is finite (all ranks get the same answer)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    bad = torch.tensor([float(not all(is_finite(p) for p in local))],
                       device=local[0].device)  # NCCL reduces device tensors only
    return not bool(all_reduce_max(bad, env))
