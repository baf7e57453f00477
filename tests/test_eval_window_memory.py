"""`kiln eval`'s per-window losses cost a few bytes a window, not a Python float each: a
whole train split (`eval.max_batches = 0`) can hold millions of windows."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import torch
from torch import nn

from kiln.eval.perplexity import evaluate


class TinyLM(nn.Module):
    """The least model `evaluate(details=True)` scores: embeddings as hidden states."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 8), nn.Linear(8, vocab, bias=False)

    def hidden_states(self, x, caches, docs):
        return self.embed(x)


def test_window_losses_cost_bytes_not_python_floats(tmp_path):
    """30,000 one-token windows. tracemalloc sees numpy's arrays and Python objects (not
    torch's tensors): the gathered float64 array is 8 bytes a window; the losses kept as a
    Python list, as before, cost 33 (a float object and its pointer, plus the array)."""
    windows, vocab = 30_000, 260
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    np.random.default_rng(0).integers(1, vocab, windows + 1, dtype=np.uint16).tofile(
        tokens / "val_00000.bin")
    split = {"shards": [{"file": "val_00000.bin", "tokens": windows + 1}], "documents": 1,
             "tokens": windows + 1, "bytes": windows + 1}
    (tokens / "index.json").write_text(json.dumps(
        {"dtype": "uint16", "vocab_size": vocab, "eos_id": 0, "val": split, "train": split,
         "unigram_bpb": 8.0}))
    torch.manual_seed(0)
    tracemalloc.start()
    try:
        with torch.inference_mode():
            got = evaluate(TinyLM(vocab), tokens, "val", 1, 512, 0, torch.device("cpu"), "fp32",
                           details=True, next_token_positions=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got["window_losses"]) == windows
    assert peak / windows < 16, f"{peak / windows:.1f} bytes a window"
