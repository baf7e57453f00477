"""Trinity architecture options, each switchable: the digest's tiny checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kiln.config import ConfigError, ModelConfig, load_config
from kiln.model import Transformer, count_params
from kiln.model.layers import Attention, rope_tables, sliding_window_attention
from kiln.model.moe import MoE
from kiln.model.transformer import Block, is_local_layer


def trinity_tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=101, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=64,
                local_per_global=3, sliding_window=5, global_rope=False, qk_norm=True,
                attn_gate=True, sandwich_norm=True, embed_scale=True, tie_embeddings=False,
                n_experts=4, n_dense_layers=1, top_k=2, expert_hidden=16, route_scale=2.0)
    return ModelConfig(**{**base, **kw})


def attn_inputs(t=12, dim=32, heads=4):
    torch.manual_seed(0)
    cos, sin = rope_tables(dim // heads, 64, 10000.0)
    return torch.randn(2, t, dim), cos, sin


def test_layer_pattern_is_three_local_then_global():
    cfg = trinity_tiny(n_layers=8)
    assert [is_local_layer(cfg, i) for i in range(8)] == [True, True, True, False] * 2


def test_zero_gate_halves_the_ungated_output():
    x, cos, sin = attn_inputs()
    gated = Attention(32, 4, 2, gate=True)
    plain = Attention(32, 4, 2, gate=False)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("wg")})
    torch.nn.init.zeros_(gated.wg.weight)
    t = x.shape[1]
    torch.testing.assert_close(gated(x, cos[:t], sin[:t]), 0.5 * plain(x, cos[:t], sin[:t]),
                               rtol=0, atol=1e-7)


def _reference_attention(att: Attention, x, cos, sin):
    """The digest's attention written out: QK-norm (with its gains) before RoPE, causal
    softmax over GQA-shared keys, the gate on the heads' output before Wo."""
    from kiln.model.layers import apply_rope

    b, t, _ = x.shape
    h, kvh, hd = att.n_heads, att.n_kv_heads, att.head_dim

    def heads(w, n):
        return (x @ w.weight.T).view(b, t, n, hd)

    def rms(z, norm):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight

    q, k, v = heads(att.wq, h), heads(att.wk, kvh), heads(att.wv, kvh)
    if att.q_norm is not None:
        q, k = rms(q, att.q_norm), rms(k, att.k_norm)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    if att.rope:
        q, k = apply_rope(q, cos[:t], sin[:t]), apply_rope(k, cos[:t], sin[:t])
    k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
    scores = (q @ k.transpose(-1, -2)) / hd**0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * hd)
    if att.wg is not None:
        y = y * torch.sigmoid(x @ att.wg.weight.T)
    return y @ att.wo.weight.T


@pytest.mark.parametrize("rope", [True, False])
def test_gated_qk_normed_attention_matches_the_written_out_reference(rope):
    """Random QK-norm gains and a non-zero gate: QK-norm after RoPE, or the gate after Wo,
    would give other numbers (a zero gate halves the output either way)."""
    x, cos, sin = attn_inputs()
    att = Attention(32, 4, 2, rope=rope, qk_norm=True, gate=True, kernel="sdpa").double()
    with torch.no_grad():
        for norm in (att.q_norm, att.k_norm):
            norm.weight.uniform_(0.5, 1.5)
    x, cos, sin = x.double(), cos.double(), sin.double()
    t = x.shape[1]
    # RMSNorm keeps fp32 statistics by design: fp64 agrees to ~1e-8 (the mutants miss by ~1e-2)
    torch.testing.assert_close(att(x, cos[:t], sin[:t]), _reference_attention(att, x, cos, sin),
                               rtol=1e-6, atol=1e-6)


def _rotate_half_by_hand(z: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoPE of (B, H, T, D) in the rotate-half layout, angles in fp64 from scratch."""
    d, t = z.shape[-1], z.shape[-2]
    angle = torch.arange(t, dtype=torch.float64)[:, None] * theta ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = angle.cos(), angle.sin()
    z1, z2 = z[..., : d // 2], z[..., d // 2 :]
    return torch.cat([z1 * c - z2 * s, z2 * c + z1 * s], dim=-1)


@pytest.mark.parametrize("kernel, window", [("sdpa", 0), ("matmul", 0), ("sdpa", 4),
                                            ("matmul", 4)])
def test_head_dim_set_apart_from_dim_matches_a_reference(kernel, window):
    """Trinity Large runs 48 heads of 128 at d_model 3072: the heads are 2 x dim wide. Here
    4 heads of 8 (2 kv) at dim 16, with QK-norm, RoPE, the gate and a window, written out by
    hand (RoPE tables included): q, gate and o projections are 32 wide, k and v 16."""
    torch.manual_seed(0)
    att = Attention(16, 4, 2, head_dim=8, window=window, qk_norm=True, gate=True,
                    kernel=kernel).double()
    assert att.wq.weight.shape == (32, 16) and att.wk.weight.shape == (16, 16)
    assert att.wg.weight.shape == (32, 16) and att.wo.weight.shape == (16, 32)
    with torch.no_grad():
        for norm in (att.q_norm, att.k_norm):
            norm.weight.uniform_(0.5, 1.5)
    b, t = 2, 11
    x = torch.randn(b, t, 16, dtype=torch.float64, requires_grad=True)

    def rms(z, w):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    q = rms((x @ att.wq.weight.T).view(b, t, 4, 8), att.q_norm.weight).transpose(1, 2)
    k = rms((x @ att.wk.weight.T).view(b, t, 2, 8), att.k_norm.weight).transpose(1, 2)
    v = (x @ att.wv.weight.T).view(b, t, 2, 8).transpose(1, 2)
    q, k = _rotate_half_by_hand(q), _rotate_half_by_hand(k)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    lag = torch.arange(t)[:, None] - torch.arange(t)[None, :]
    hidden = (lag < 0) | ((lag >= window) if window else False)
    scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(hidden, float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 32)
    want = (y * torch.sigmoid(x @ att.wg.weight.T)) @ att.wo.weight.T

    cos, sin = rope_tables(8, 16, 10000.0)
    got = att(x, cos[:t].double(), sin[:t].double())
    # the rope tables are fp32 by design: fp64 agrees to ~1e-7
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    g_got, = torch.autograd.grad(got.square().sum(), x)
    g_want, = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(g_got, g_want, rtol=1e-6, atol=1e-6)


def test_model_head_dim_reaches_rope_flops_and_the_exports():
    from kiln.export.hf_afmoe import afmoe_config
    from kiln.model import flops_per_token

    cfg = trinity_tiny(dim=16, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=4)
    model = Transformer(cfg)
    assert model.rope_cos.shape == (64, 8)
    assert model.layers[0].attn.wq.weight.shape == (32, 16)
    assert afmoe_config(model, 0)["head_dim"] == 8
    wide = flops_per_token(cfg, 32) - flops_per_token(dataclasses.replace(cfg, head_dim=4), 32)
    # per layer: q, k, v, gate and o over head_dim 8 vs 4 (6 x params), attention 12 x H x span
    span = 3 * 5 + 32  # three local layers see 5 positions, the global one 32
    assert wide == 6 * 4 * 16 * 4 * (2 * 4 + 2 * 2 + 4) + 12 * 4 * 4 * span
    with pytest.raises(ConfigError, match="model.head_dim .* must be even"):
        load_config(None, ["model.head_dim=7"])


def test_blocks_put_rope_on_local_layers_only():
    cfg = trinity_tiny(n_layers=8)
    assert [Block(cfg, i).attn.rope for i in range(8)] == [True, True, True, False] * 2
    assert [Block(cfg, i).attn.window for i in range(4)] == [5, 5, 5, 0]
    cfg = dataclasses.replace(cfg, global_rope=True)
    assert all(Block(cfg, i).attn.rope for i in range(8))


def test_global_nope_layer_ignores_positions_local_rope_layer_does_not():
    x, cos, sin = attn_inputs()
    t = x.shape[1]
    nope = Attention(32, 4, 2, rope=False)
    rope = Attention(32, 4, 2, rope=True, window=4)
    rope.load_state_dict(nope.state_dict())
    pos = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:t]  # arbitrary ids
    shifted = (cos[pos], sin[pos])
    torch.testing.assert_close(nope(x, cos[:t], sin[:t]), nope(x, *shifted))
    assert not torch.allclose(rope(x, cos[:t], sin[:t]), rope(x, *shifted), atol=1e-4)


def test_sliding_window_matches_dense_banded_reference():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 23, 8) for _ in range(3))
    for window in (1, 4, 7, 23, 40):
        i = torch.arange(23)[:, None]
        lag = i - torch.arange(23)[None, :]
        mask = (lag >= 0) & (lag < window)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(sliding_window_attention(q, k, v, window), ref,
                                   atol=1e-5, rtol=1e-5)


def test_sliding_window_gradients_match_the_dense_banded_reference(monkeypatch):
    """Forward and backward against a dense band mask, over a ragged last block; and SDPA
    only ever sees 4-D inputs (the fused CUDA kernels refuse 5-D ones)."""
    torch.manual_seed(0)
    ranks = []
    real_sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        ranks.append((q.dim(), k.dim(), v.dim()))
        return real_sdpa(q, k, v, **kwargs)

    for window in (1, 5, 8):
        q, k, v = (torch.randn(2, 3, 21, 8, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(2, 3, 21, 8, dtype=torch.float64)
        lag = torch.arange(21)[:, None] - torch.arange(21)[None, :]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=(lag >= 0) & (lag < window))
        expected = [ref.detach(), *torch.autograd.grad(ref, (q, k, v), grad)]
        monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
        out = sliding_window_attention(q, k, v, window)
        monkeypatch.setattr(F, "scaled_dot_product_attention", real_sdpa)
        got = [out.detach(), *torch.autograd.grad(out, (q, k, v), grad)]
        for a, e in zip(got, expected):
            torch.testing.assert_close(a, e)
    assert ranks and all(r == (4, 4, 4) for r in ranks)


def test_window_locality_local_vs_global():
    x, cos, sin = attn_inputs(t=16)
    w = 4
    local = Attention(32, 4, 2, window=w)
    glob = Attention(32, 4, 2, rope=False)
    y = x.clone()
    y[:, : 15 - w + 1] += torch.randn_like(y[:, : 15 - w + 1])  # tokens before t - W + 1
    c, s = cos[:16], sin[:16]
    torch.testing.assert_close(local(x, c, s)[:, 15], local(y, c, s)[:, 15])
    assert not torch.allclose(glob(x, c, s)[:, 15], glob(y, c, s)[:, 15], atol=1e-4)


@pytest.mark.parametrize("gain", [0.0, 0.37])
def test_post_norm_gain_sets_branch_rms_and_zero_is_identity(gain):
    cfg = trinity_tiny(n_experts=0, post_norm_gain=1.0)
    block = Block(cfg, 3)
    x, cos, sin = attn_inputs()
    for norm in (block.attn_post_norm, block.ffn_post_norm):
        torch.nn.init.constant_(norm.weight, gain)
    t = x.shape[1]
    out = block(x, cos[:t], sin[:t])
    if gain == 0.0:
        assert torch.equal(out, x)
    else:
        raw = block.attn(block.attn_norm(x), cos[:t], sin[:t])
        rms = block.attn_post_norm(raw).pow(2).mean(-1).sqrt()
        ms = raw.pow(2).mean(-1)  # RMSNorm's eps shrinks tiny branches slightly below c
        expected = gain * (ms / (ms + cfg.norm_eps)).sqrt()
        torch.testing.assert_close(rms, expected, atol=1e-6, rtol=1e-5)
        assert rms.min() > 0.99 * gain
        # the block itself adds each branch through its own post-norm: with the other
        # branch's gain at 0, out - x is the live branch normalised to RMS `gain`
        for live, off, branch in ((block.attn_post_norm, block.ffn_post_norm,
                                   lambda z: block.attn(block.attn_norm(z), cos[:t], sin[:t])),
                                  (block.ffn_post_norm, block.attn_post_norm,
                                   lambda z: block.ffn(block.ffn_norm(z)))):
            torch.nn.init.constant_(live.weight, gain)
            torch.nn.init.zeros_(off.weight)
            with torch.no_grad():
                added = block(x, cos[:t], sin[:t]) - x
                b = branch(x)
            ms = b.pow(2).mean(-1, keepdim=True)
            assert (ms.sqrt() - gain).abs().min() > 0.05  # the raw branch is of another size
            torch.testing.assert_close(added, gain * b * torch.rsqrt(ms + cfg.norm_eps),
                                       atol=1e-5, rtol=1e-5)


def test_depth_scaled_post_norm_init():
    model = Transformer(trinity_tiny(n_layers=16, n_experts=0))
    assert torch.all(model.layers[5].attn_post_norm.weight == 0.25)
    assert torch.all(model.layers[5].attn_norm.weight == 1.0)


def test_kv_cache_decoding_matches_full_forward_on_trinity_model():
    torch.manual_seed(0)
    model = Transformer(trinity_tiny()).eval()
    tokens = torch.randint(0, 101, (1, 20))
    with torch.no_grad():
        full = model(tokens)
        caches = model.new_caches()
        steps = [model(tokens[:, :6], caches)]
        steps += [model(tokens[:, i : i + 1], caches) for i in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_chunked_training_loss_equals_full_cross_entropy(monkeypatch):
    import kiln.model.fused_loss as fl

    monkeypatch.setattr(fl, "CHUNK_ELEMENTS", 1)  # 16-row chunks: 30 tokens take two
    torch.manual_seed(0)
    model = Transformer(trinity_tiny())
    x, y = torch.randint(0, 101, (3, 10)), torch.randint(0, 101, (3, 10))
    ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss = model(x, targets=y)
    torch.testing.assert_close(loss, ref)
    g1 = torch.autograd.grad(loss, model.head.weight)[0]
    g2 = torch.autograd.grad(F.cross_entropy(model(x).flatten(0, 1), y.flatten()),
                             model.head.weight)[0]
    torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-5)


def test_moe_layers_follow_dense_prefix_and_active_count():
    model = Transformer(trinity_tiny())
    kinds = [type(layer.ffn).__name__ for layer in model.layers]
    assert kinds == ["SwiGLU", "MoE", "MoE", "MoE"]
    counts = count_params(model)
    per_expert = 3 * 32 * 16
    assert counts["params"] - counts["params_active"] == 3 * per_expert * (4 - 2)


def meta_counts(recipe: str) -> dict[str, int]:
    cfg = load_config(recipe)
    with torch.device("meta"):
        return count_params(Transformer(dataclasses.replace(cfg.model, vocab_size=200192)))


def test_nano_parameter_count_matches_paper():
    counts = meta_counts("recipes/trinity-nano.toml")
    assert counts["params"] == pytest.approx(6.1e9, rel=0.05)
    assert counts["params_active"] == pytest.approx(1.0e9, rel=0.1)


def test_mini_parameter_count_matches_paper():
    counts = meta_counts("recipes/trinity-mini.toml")
    assert counts["params"] == pytest.approx(26e9, rel=0.05)
    assert counts["params_active"] == pytest.approx(3e9, rel=0.15)


def test_large_parameter_count_matches_paper():
    """48 heads of 128 at dim 3072 (head_dim apart from dim): 398.6B / 13.37B. Heads of
    dim / n_heads = 64 would give 396.7B but 11.48B active, 12% short of the paper's 13B."""
    counts = meta_counts("recipes/trinity-large.toml")
    assert counts["params"] == pytest.approx(400e9, rel=0.05)
    assert counts["params_active"] == pytest.approx(13e9, rel=0.05)


def test_moe_module_is_used_through_model_config():
    model = Transformer(trinity_tiny(balance="sign", balance_rate=1e-3))
    moe = model.layers[1].ffn
    assert isinstance(moe, MoE) and moe.balancer.rule == "sign" and moe.route_scale == 2.0
