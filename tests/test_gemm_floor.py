"""The GEMM floor benchmark counts exactly the FLOPs the model's FLOP count claims."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gemm_floor as floor_mod  # noqa: E402
from gemm_floor import gemm_floor  # noqa: E402

from kiln.config import ModelConfig  # noqa: E402
from kiln.model import ffn_hidden_size, flops_per_token  # noqa: E402


@pytest.mark.parametrize("kv,tied", [(2, True), (4, False)])
def test_floor_flops_equal_flops_per_token(kv, tied):
    cfg = ModelConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=kv,
                      max_seq_len=16, tie_embeddings=tied)
    floor = gemm_floor(cfg, batch=2, seq_len=16, dtype=torch.float32, repeats=1)
    assert floor.flops == flops_per_token(cfg, 16) * 2 * 16  # the sum over the GEMMs it timed
    assert set(floor.parts) == {"attention", "projections", "mlp", "head"}
    assert all(v > 0 for v in floor.parts.values())
    assert floor.seconds == pytest.approx(sum(floor.parts.values()))
    assert floor.best_rate > 0


def test_floor_uses_the_configured_head_width():
    """`head_dim` apart from dim // n_heads (as Trinity Large sets it): the floor times the
    projections and attention products at the model's head width, so its FLOPs are still
    those `flops_per_token` counts (dim // n_heads once timed a model half the width)."""
    cfg = ModelConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      max_seq_len=16)
    floor = gemm_floor(cfg, batch=2, seq_len=16, dtype=torch.float32, repeats=1)
    assert floor.flops == flops_per_token(cfg, 16) * 2 * 16


def test_floor_refuses_models_it_does_not_model():
    moe = ModelConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_experts=4)
    with pytest.raises(ValueError, match="dense decoders"):
        gemm_floor(moe, batch=1, seq_len=8, dtype=torch.float32)


def test_floor_keeps_its_fastest_gemm_ready_to_time_again():
    cfg = ModelConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    floor = gemm_floor(cfg, batch=2, seq_len=16, dtype=torch.float32, repeats=1)
    out = floor.best_call()
    # FLOPs of one call: 2 x output elements x a contracted size of the step: tokens (2 x 16),
    # dim, q + k + v (32 + 16 + 16), SwiGLU hidden (128) or gate|up (256), vocab, seq, head
    inner = {32, 64, 128, 256, 96, 16, 8}
    assert any(floor.best_flops == 2 * out.numel() * k for k in inner)
    assert floor.best_flops <= floor.flops


def test_floor_flops_and_parts_by_hand(monkeypatch):
    """Each GEMM timed at 1 s: the parts count the GEMMs of each part (fused q|k|v and
    gate|up, 3 per linear: forward, input and weight gradient; 6 attention products a layer;
    no GEMM left out or timed twice), and the FLOPs match a count by hand: 2 m k n a GEMM."""
    monkeypatch.setattr(floor_mod, "median_time", lambda fn, repeats: 1.0)
    cfg = ModelConfig(vocab_size=96, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                      max_seq_len=16)
    b, t = 2, 16
    floor = gemm_floor(cfg, batch=b, seq_len=t, dtype=torch.float32, repeats=1)
    assert floor.parts == {"attention": 6 * 3, "projections": 6 * 3, "mlp": 6 * 3, "head": 3}
    assert floor.seconds == 6 * 3 * 3 + 3
    m, d, hd, f = b * t, 32, 8, ffn_hidden_size(cfg)
    linears = [(d, 4 * hd + 2 * 2 * hd), (4 * hd, d), (d, 2 * f), (f, d)]  # (in, out) a layer
    per_layer = sum(3 * 2 * m * k * n for k, n in linears) + 6 * 2 * b * 4 * t * t * hd
    assert floor.flops == 3 * per_layer + 3 * 2 * m * d * 96
    biggest = max([2 * m * k * n for k, n in linears] + [2 * m * d * 96, 2 * b * 4 * t * t * hd])
    assert floor.best_flops == floor.best_rate == biggest  # FLOPs over 1 s
