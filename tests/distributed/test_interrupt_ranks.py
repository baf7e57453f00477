"""Rank 0 interrupted (Ctrl-C, a stop by SIGTERM) in work the other ranks wait for — the
data stages of `kiln run`, a checkpoint write — stops every rank as interrupted, no hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, tiny_config
from launch import run_python
from mp_helpers import run_function_on_ranks

from kiln.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


def _stopped(e: BaseException) -> str:
    return f"{type(e).__name__} {getattr(e, 'exit_code', '-')}: {e}"


def _run_with_prepare_interrupted_on_rank_zero(rank: int, world_size: int, run_dir) -> str:
    from kiln.commands import run as run_chain

    def interrupted(cfg):
        raise KeyboardInterrupt

    run_chain.cmd_prepare = interrupted  # runs on rank 0 only: the others must be told
    try:
        run_chain.cmd_run(tiny_config(run_dir / "run", "train.parallel=ddp", "train.steps=1"))
    except BaseException as e:  # what each rank would end with
        return _stopped(e)
    return "ran"


def test_a_data_stage_interrupted_on_rank_zero_stops_every_rank(tmp_path):
    """Rank 0 stops as interrupted (a `kiln run` chain ends, exit 130); rank 1, waiting for
    the data, learns why, where it would wait for a broadcast rank 0 never sends."""
    said = run_function_on_ranks(_run_with_prepare_interrupted_on_rank_zero, 2,
                                 args=(tmp_path,), timeout=90)
    assert said[0] == "KeyboardInterrupt -: "
    assert said[1] == ("MainRankInterrupted 130: rank 0 was interrupted in its data stages "
                       "(KeyboardInterrupt)")


def _train_with_a_write_interrupted_on_rank_zero(rank: int, world_size: int, run_dir) -> str:
    from kiln.train import checkpoint as ckpt_mod

    if rank == 0:  # only rank 0 writes checkpoints: a second Ctrl-C in the middle of it
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        ckpt_mod.save_tensors = interrupted
    trainer = Trainer(tiny_config(run_dir, "train.parallel=ddp", "train.steps=1"))
    try:
        trainer.fit()
    except BaseException as e:
        return _stopped(e)
    return "trained"


def test_a_checkpoint_write_interrupted_on_rank_zero_stops_every_rank(tiny_run):
    said = run_function_on_ranks(_train_with_a_write_interrupted_on_rank_zero, 2,
                                 args=(tiny_run,), timeout=90)
    assert said[0] == "KeyboardInterrupt -: "
    ckpt = tiny_run / "checkpoints" / "step_00000001"
    assert said[1] == (f"MainRankInterrupted 130: rank 0 was interrupted while it wrote "
                       f"checkpoint {ckpt} (KeyboardInterrupt); that step is not saved")
    assert not ckpt.exists()


KILLED_IN_PREPARE = """
import os, signal, sys
from kiln import cli
from kiln.commands import run as run_chain
if os.environ["RANK"] == "0":
    def prepare(cfg):  # rank 0 dies at once (a SIGTERM is a stop now, said and told)
        os.kill(os.getpid(), signal.SIGKILL)
    run_chain.cmd_prepare = prepare
sys.exit(cli.main(sys.argv[1:]))
"""


KILLED_AS_THE_RANKS_CONNECT = """
import os, signal, sys
import torch.distributed as dist
from kiln import cli
made = dist.new_group
def new_group(*args, **kwargs):  # the ranks' second group, connected as they start
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)  # rank 1 connects it still, in the dead store
    return made(*args, **kwargs)
dist.new_group = new_group
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("script", [KILLED_IN_PREPARE, KILLED_AS_THE_RANKS_CONNECT],
                         ids=["in the data stages", "as the ranks connect a group"])
def test_rank_zero_killed_in_the_data_stages_of_a_hand_launch_is_one_line(tmp_path, script):
    """Without torchrun rank 0 holds the rendezvous store: its death reaches rank 1 (waiting
    for the data) as the store's closed connection, which is a lost rank, said in one line,
    not pages of C++ frames. Killed while rank 1's gloo still connects a group (made certain
    here: rank 0 dies as it starts to), each store call of gloo's that failed was logged
    with its frames before the error (`connect_log`)."""
    killed = tmp_path / "killed.py"
    killed.write_text(script)
    sets = [a for kv in [*TINY, "train.parallel=ddp", f'run.dir="{tmp_path / "run"}"']
            for a in ("--set", kv)]
    with pytest.raises(RuntimeError) as failed:
        run_python([str(killed), "run", str(REPO / "recipes" / "quickstart.toml"), *sets],
                   world_size=2, timeout=120)
    said = str(failed.value)
    assert "rank 0 exited -9" in said
    rank1 = said.split("rank 1 exited 1:", 1)[1]
    assert "kiln: run stopped: another rank of this launch failed or was killed" in rank1
    for noise in ("Traceback", "TCPStore", "frame #"):
        assert noise not in rank1, rank1


def _train_with_rank_one_failing_at_the_first_checkpoint(rank: int, world_size: int,
                                                         run_dir) -> tuple[str, bool]:
    from kiln.parallel.distributed import lost_a_rank
    from kiln.train import checkpoint as ckpt_mod

    if rank == 1:  # gathering the state fails here alone, while rank 0 goes on to write
        def failing(model):
            raise MemoryError("simulated: no memory for the checkpoint's copy")

        ckpt_mod.model_tensors = failing
    trainer = Trainer(tiny_config(run_dir, "train.parallel=ddp", "train.steps=6"))
    try:
        trainer.fit()
    except (MemoryError, RuntimeError) as e:  # rank 1 then exits, as its process would
        return type(e).__name__, isinstance(e, RuntimeError) and lost_a_rank(e)
    return "trained", False


def test_rank_zero_is_not_left_waiting_for_a_rank_that_died_before_its_first_checkpoint(
        tiny_run):
    """Rank 1 fails as the first checkpoint begins; rank 0 writes it, then learns that rank
    1 is gone, where it would wait a week for it to join the checkpoint's group."""
    # each result is waited for `timeout` after the one before: rank 1's first, counted from
    # the spawn (two start-ups, importing torch, and six steps: 58 s under a CPU hog), then
    # rank 0's, counted from rank 1's end: the wait for a rank gone that this test is about
    said = run_function_on_ranks(_train_with_rank_one_failing_at_the_first_checkpoint, 2,
                                 args=(tiny_run,), timeout=120)
    assert said[1] == ("MemoryError", False)
    assert said[0][1], said[0]  # rank 0: a lost rank, said in one line by `kiln`
