"""A checkpoint write that fails on rank 0 stops every rank with its error, not rank 0 alone."""

from __future__ import annotations

import errno

from conftest import tiny_config
from mp_helpers import run_function_on_ranks

from kiln.train.trainer import Trainer


def _train_with_a_full_disk_on_rank_zero(rank: int, world_size: int, run_dir) -> str:
    from kiln.errors import CheckpointError
    from kiln.train import checkpoint as ckpt_mod

    if rank == 0:  # only rank 0 writes checkpoints
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        ckpt_mod.save_tensors = full
    trainer = Trainer(tiny_config(run_dir, "train.parallel=ddp", "train.steps=1"))
    try:
        trainer.fit()
    except CheckpointError as e:
        return str(e)
    return "trained"


def test_a_checkpoint_write_failing_on_rank_zero_stops_every_rank(tiny_run):
    """Without being told, rank 1 would wait at the barrier after the write (a week's
    timeout: torchrun stops it, a hand launch hangs); told, it raises rank 0's error."""
    said = run_function_on_ranks(_train_with_a_full_disk_on_rank_zero, 2, args=(tiny_run,),
                                 timeout=90)
    assert said[0] == said[1]
    assert "cannot write checkpoint" in said[0] and "No space left on device" in said[0]
    assert "no checkpoint was written" in said[0]
