"""One rank of `test_window_gather_ranks`: each rank writes its windows' split places into
its slots; rank 0's gathered array must be 0, 1, 2, ... (the split's order)."""

import sys

import numpy as np
import torch

from kiln.data.loader import eval_batches
from kiln.eval.window_losses import gather_window_losses
from kiln.parallel.distributed import init_distributed, shutdown

token_dir, seq_len, batch_size, max_batches, per_call = (
    sys.argv[1], *(int(a) for a in sys.argv[2:6]))
env = init_distributed(torch.device("cpu"))
try:
    batches = eval_batches(token_dir, "val", seq_len, batch_size, max_batches, env.rank,
                           env.world_size)
    mine = torch.full((batches.rank_slots,), -1.0, dtype=torch.float64)
    for i, b in enumerate(batches.batch_ids):
        places = torch.arange(b * batch_size, min((b + 1) * batch_size, batches.scored_windows))
        mine[i * batch_size : i * batch_size + len(places)] = places.double()
    got = gather_window_losses(mine, batches, env, per_call=per_call)
    if env.is_main:
        assert got is not None and got.dtype == np.float64
        assert np.array_equal(got, np.arange(batches.scored_windows)), got
        print(f"gathered {len(got)} windows in order")
    else:
        assert got is None
finally:
    shutdown(env)
