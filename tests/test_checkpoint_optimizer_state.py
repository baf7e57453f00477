"""An optimizer.pt that unpickles but is not what Kiln wrote (an altered file, or damage to a
checkpoint from before checksums) is refused as unreadable, naming the checkpoint before it,
like an altered trainer.pt: not an AttributeError traceback, nor a resume announced and then
an internal assertion at its first step."""

from __future__ import annotations

import pytest
import torch
from conftest import as_written, tiny_config

from kiln.errors import CheckpointError
from kiln.train.trainer import Trainer


@pytest.mark.parametrize("tamper", ["a list", "no param_groups", "a moment of another shape",
                                    "no moments"])
def test_an_altered_optimizer_state_is_refused_naming_the_previous_checkpoint(tiny_run, tamper):
    Trainer(tiny_config(tiny_run, "train.steps=6", "train.checkpoint_every=3")).fit()
    path = tiny_run / "checkpoints" / "step_00000006" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    if tamper == "a list":
        state = [state]
    elif tamper == "no param_groups":
        del state["param_groups"]
    elif tamper == "no moments":  # torch loads it, and the moments restart from zero
        state["state"] = {}
    else:
        moments = next(iter(state["state"].values()))
        moments["exp_avg"] = torch.zeros(3)
    torch.save(state, path)
    as_written(path.parent)  # written so: the optimizer state's own checks refuse it
    with pytest.raises(CheckpointError, match=r"step_00000006 is unreadable \(\w+Error: "
                       r"optimizer\.pt.*previous one, step_00000003"):
        Trainer(tiny_config(tiny_run, "train.steps=9"))
    assert path.is_file()  # nothing deleted
