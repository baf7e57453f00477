"""A rank's word that it stopped travels in a store Kiln keeps from the rendezvous (through
torch's public `rendezvous` and `init_process_group(store=...)`), not in the one torch's
private `_get_default_store` gives: a torch without that function left the word unsaid,
silently, and rank 0 said another rank "failed or was killed" for a rank that stopped
cleanly on a signal of its own."""

from __future__ import annotations

from launch import run_python

WORD = """
import torch
import torch.distributed as dist
if hasattr(dist.distributed_c10d, "_get_default_store"):
    del dist.distributed_c10d._get_default_store  # a torch that moved or renamed it
from kiln.parallel.distributed import init_distributed, shutdown
from kiln.parallel.rank_stops import leave_word, stopped_ranks
env = init_distributed(torch.device("cpu"))
if env.rank == 1:
    leave_word("stopped on SIGTERM")
dist.barrier()
print("said:", stopped_ranks())
dist.barrier()
shutdown(env)
"""


def test_a_stopped_ranks_word_is_read_without_torchs_private_store(tmp_path):
    script = tmp_path / "word.py"
    script.write_text(WORD)
    said = run_python([str(script)], world_size=2, timeout=60, every_rank=True)
    assert "said: {1: 'stopped on SIGTERM'}" in said[0], said[0]
    assert "said: {}" in said[1], said[1]
