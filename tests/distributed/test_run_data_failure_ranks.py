"""`kiln run` under torchrun: a data stage failing on rank 0 (which alone prepares the data)
stops every rank with its error, not rank 0 alone."""

from __future__ import annotations

from conftest import tiny_config
from mp_helpers import run_function_on_ranks


def _run_with_prepare_failing_on_rank_zero(rank: int, world_size: int, run_dir) -> str:
    from kiln.commands import run as run_chain
    from kiln.errors import KilnError, NoDocumentsError

    def no_documents(cfg):
        raise NoDocumentsError("every input was skipped (simulated)")

    run_chain.cmd_prepare = no_documents  # runs on rank 0 only: the others must be told
    try:
        run_chain.cmd_run(tiny_config(run_dir / "run", "train.parallel=ddp", "train.steps=1"))
    except KilnError as e:
        return f"{type(e).__name__}: {e}"
    return "ran"


def test_a_data_stage_failing_on_rank_zero_stops_every_rank(tmp_path):
    """Without being told, rank 1 would wait at the barrier after the data stages (a week's
    timeout: torchrun stops it, a hand launch hangs); told, it raises rank 0's error."""
    said = run_function_on_ranks(_run_with_prepare_failing_on_rank_zero, 2, args=(tmp_path,),
                                 timeout=90)
    assert said[0] == "NoDocumentsError: every input was skipped (simulated)"
    assert said[1] == ("KilnError: rank 0's data stages failed (NoDocumentsError: every input "
                       "was skipped (simulated))")
