"""Kiln's matmul attention against SDPA (the reference kernel) and an fp64 reference."""

import pytest
import torch
import torch.nn.functional as F

import kiln.model.matmul_attention as ma
from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.model.layers import sliding_window_attention
from kiln.model.matmul_attention import matmul_attention, uses_matmul_path


def _inputs(b, h, kv, t, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # the model's layout: (B, T, heads, D) transposed to (B, heads, T, D)
    q, k, v = (torch.randn(b, t, n, d, generator=g).to(dtype).transpose(1, 2).requires_grad_()
               for n in (h, kv, kv))
    return q, k, v, torch.randn(b, h, t, d, generator=g).to(dtype)


def _run(fn, q, k, v, grad):
    for x in (q, k, v):
        x.grad = None
    out = fn(q, k, v)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


@pytest.fixture(params=[ma.BLOCK, 5], ids=["default-block", "block-5"])
def block(request, monkeypatch):
    """Run with the default query block and with small blocks, so short test sequences
    cross several blocks (a ragged last one included)."""
    monkeypatch.setattr(ma, "BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("h, kv", [(4, 4), (8, 2)])
def test_fp32_matches_sdpa_output_and_gradients(h, kv, block):
    q, k, v, grad = _inputs(2, h, kv, 33, 16, torch.float32)
    got = _run(matmul_attention, q, k, v, grad)
    ref = _run(_sdpa, q, k, v, grad)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 5, 16])
def test_fp32_sliding_window_matches_the_blocked_sdpa_path(window, block):
    q, k, v, grad = _inputs(2, 4, 2, 37, 8, torch.float32)

    def blocked(q, k, v):  # the reference path repeats kv heads itself
        return sliding_window_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                        window)

    got = _run(lambda a, b, c: matmul_attention(a, b, c, window), q, k, v, grad)
    ref = _run(blocked, q, k, v, grad)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_sliding_window_hides_keys_older_than_the_window(block):
    q, k, v, grad = _inputs(1, 2, 1, 20, 8, torch.bfloat16)
    grad = torch.zeros_like(grad)
    grad[:, :, 15] = 1.0  # only query 15: with window 4 it sees keys 12..15
    _, _, dk, dv = _run(lambda a, b, c: matmul_attention(a, b, c, 4), q, k, v, grad)
    seen = torch.zeros(20, dtype=torch.bool)
    seen[12:16] = True
    assert dv[0, 0, ~seen].abs().max() == 0 and dk[0, 0, ~seen].abs().max() == 0
    assert dv[0, 0, seen].abs().min() > 0


def test_bf16_error_against_fp64_is_of_sdpas_size(block):
    q, k, v, grad = _inputs(4, 8, 4, 128, 64, torch.bfloat16)
    exact = _run(_sdpa, *(x.detach().double().requires_grad_() for x in (q, k, v)), grad.double())
    ours = _run(matmul_attention, q, k, v, grad)
    sdpa = _run(_sdpa, q, k, v, grad)
    for name, a, b, e in zip(("out", "dq", "dk", "dv"), ours, sdpa, exact):
        err_ours = ((a.double() - e).norm() / e.norm()).item()
        err_sdpa = ((b.double() - e).norm() / e.norm()).item()
        assert err_ours < 2.5 * err_sdpa and err_ours < 1e-2, (name, err_ours, err_sdpa)


def test_future_keys_get_exactly_zero_weight_and_gradient(block):
    q, k, v, grad = _inputs(1, 4, 2, 16, 8, torch.bfloat16)
    grad = torch.zeros_like(grad)
    grad[:, :, :10] = 1.0  # only the first 10 query positions matter
    _, _, dk, dv = _run(matmul_attention, q, k, v, grad)
    assert dk[:, :, 10:].abs().max() == 0 and dv[:, :, 10:].abs().max() == 0
    out = matmul_attention(q, k, v).detach()
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 12], v2[:, :, 12] = 50.0, -50.0
    assert torch.equal(matmul_attention(q.detach(), k2, v2)[:, :, :12], out[:, :, :12])


def test_dispatch_takes_the_matmul_path_only_for_small_cpu_training(monkeypatch):
    q = torch.zeros(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    assert uses_matmul_path(q, "auto")
    assert not uses_matmul_path(q.detach(), "auto")  # inference: SDPA's forward is faster
    assert uses_matmul_path(q.float(), "auto")  # fp32 training: the blocks beat SDPA too
    assert not uses_matmul_path(q.double(), "auto")  # not a training precision: SDPA
    with torch.no_grad():
        assert not uses_matmul_path(q, "auto")
    assert not uses_matmul_path(q, "sdpa") and uses_matmul_path(q.float(), "matmul")
    monkeypatch.setattr(ma, "MAX_PROBS_BYTES", 2 * 4 * 16 * 16 * 2 - 1)  # one byte short
    assert not uses_matmul_path(q, "auto")


def test_kept_probabilities_are_the_visible_blocks(monkeypatch):
    monkeypatch.setattr(ma, "BLOCK", 4)
    # blocks of 4 queries over 10 positions: 4 x 4 + 4 x 8 + 2 x 10 probabilities
    assert ma.kept_probs(10) == 16 + 32 + 20
    # window 3: block 2 starts at query 4 and sees keys 2.., block 3 keys 6..
    assert ma.kept_probs(10, window=3) == 16 + 4 * 6 + 2 * 4
    monkeypatch.setattr(ma, "BLOCK", 64)
    assert ma.kept_probs(10) == 100  # one block: the whole square
    # the limit counts what is kept: 2 x 4 heads x 68 positions fit exactly in bf16
    q = torch.zeros(2, 4, 68, 8, dtype=torch.bfloat16, requires_grad=True)
    kept = 64 * 64 + 4 * 68
    monkeypatch.setattr(ma, "MAX_PROBS_BYTES", 2 * 4 * kept * 2)
    assert uses_matmul_path(q, "auto") and kept < 68 * 68
    monkeypatch.setattr(ma, "MAX_PROBS_BYTES", 2 * 4 * kept * 2 - 1)
    assert not uses_matmul_path(q, "auto")


def test_gqa_head_count_must_divide():
    q, k, v, _ = _inputs(1, 6, 4, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        matmul_attention(q, k, v)


def test_model_losses_and_grads_agree_across_kernels_under_bf16_autocast():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)
    results = {}
    for kernel in ("sdpa", "matmul"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**{**cfg.__dict__, "attn_kernel": kernel}))
        x = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x[:, :-1], targets=x[:, 1:])
        loss.backward()
        results[kernel] = (loss.item(), model.layers[0].attn.wq.weight.grad.clone())
    (l1, g1), (l2, g2) = results["sdpa"], results["matmul"]
    assert abs(l1 - l2) < 2e-2 * abs(l1)
    assert ((g1 - g2).norm() / g1.norm()).item() < 5e-2
