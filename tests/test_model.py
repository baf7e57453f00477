import math

import pytest
import torch
import torch.nn.functional as F

from kiln.config import ModelConfig, load_config
from kiln.model import Transformer, count_params, flops_per_token
from kiln.model.layers import Attention, apply_rope, rope_tables, stacked_linear
from kiln.optim import param_groups
from kiln.train.schedule import lr_multiplier


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    return ModelConfig(**{**base, **kw})


def test_causality_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    model = Transformer(tiny()).eval()
    x = torch.randint(0, 97, (2, 24))
    y = x.clone()
    y[:, 15:] = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :15], b[:, :15])
    assert not torch.allclose(a[:, 15:], b[:, 15:])


def test_gqa_matches_explicit_multihead_with_shared_kv():
    """GQA equals full multi-head attention whose k/v heads are copies of the shared ones."""
    torch.manual_seed(0)
    gqa = Transformer(tiny(n_kv_heads=2)).eval()
    mha = Transformer(tiny(n_kv_heads=4)).eval()
    sd = gqa.state_dict()
    for i in range(2):
        for w in ("wk", "wv"):
            key = f"layers.{i}.attn.{w}.weight"
            sd[key] = sd[key].view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    mha.load_state_dict(sd)
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=1e-5)


def test_rope_preserves_norm_and_relative_position():
    cos, sin = rope_tables(8, 32, 10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def rot(v, pos):
        return apply_rope(v, cos[pos : pos + 1], sin[pos : pos + 1])
    assert torch.allclose(rot(q, 5).norm(), q.norm(), atol=1e-5)
    # <R_m q, R_n k> depends only on m - n
    d1 = (rot(q, 7) * rot(k, 3)).sum()
    d2 = (rot(q, 20) * rot(k, 16)).sum()
    assert torch.allclose(d1, d2, atol=1e-5)


def test_rope_matches_rotate_half_formula_and_its_gradient():
    cos, sin = rope_tables(8, 16, 10000.0)
    cos, sin = cos.double(), sin.double()
    x = torch.randn(2, 16, 3, 8, dtype=torch.double).transpose(1, 2)  # the model's strided layout
    x.requires_grad_()
    rotated = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
    torch.testing.assert_close(apply_rope(x, cos, sin), x * cos + rotated * sin)
    assert torch.autograd.gradcheck(lambda v: apply_rope(v, cos, sin), (x,))


def test_tied_embeddings_share_storage_and_count_once():
    tied, untied = Transformer(tiny(tie_embeddings=True)), Transformer(tiny(tie_embeddings=False))
    assert tied.head.weight is tied.embed.weight
    assert count_params(untied)["params"] - count_params(tied)["params"] == 97 * 32


def test_param_count_matches_formula():
    cfg = tiny(tie_embeddings=False, ffn_hidden=96)
    m = Transformer(cfg)
    hd = 32 // 4
    per_layer = 32 * hd * (4 + 4 + 2 + 2) // 1 + 3 * 32 * 96 + 2 * 32
    expected = 2 * 97 * 32 + 2 * per_layer + 32
    assert count_params(m)["params"] == expected


@pytest.mark.parametrize("vocab, tied, billions", [(102_400, False, 1.63), (102_400, True, 1.42),
                                                   (32_000, False, 1.35)])
def test_the_arxiv_to_model_config_has_the_digests_parameter_counts(vocab, tied, billions):
    """arXiv-to-model digest check: its LLaMA config (24 layers, d 2048, SwiGLU FFN 5504, 16
    heads of plain multi-head attention) is 1.63B untied at vocab 102,400, 1.42B tied, 1.35B
    at 32k; counted on the meta device (no memory), exactly against the formula."""
    cfg = ModelConfig(vocab_size=vocab, dim=2048, n_layers=24, n_heads=16, n_kv_heads=16,
                      ffn_hidden=5504, max_seq_len=768, norm_eps=1e-6, tie_embeddings=tied)
    with torch.device("meta"):
        n = count_params(Transformer(cfg))["params"]
    per_layer = 4 * 2048 * 2048 + 3 * 2048 * 5504 + 2 * 2048  # q k v o, SwiGLU, two norms
    assert n == (1 if tied else 2) * vocab * 2048 + 24 * per_layer + 2048
    assert round(n / 1e9, 2) == billions


def test_flops_per_token_formula():
    cfg = tiny(ffn_hidden=96)
    attn = 32 * 8 * (2 * 4 + 2 * 2)
    matmul = 2 * (attn + 3 * 32 * 96) + 32 * 97
    assert flops_per_token(cfg, 16) == 6 * matmul + 12 * 2 * 32 * 16


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False},
                                {"attn_gate": True, "n_kv_heads": 1, "n_layers": 3}])
def test_flops_per_token_equals_torchs_count_of_one_training_step(kw):
    """6N + 12 x dim x seq_len per layer is what torch's FlopCounterMode counts for a
    forward and backward (the fused loss's head matmuls, GQA, the gate), attention as the
    full square through SDPA's math kernel; a tied head is multiplied all the same."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = tiny(ffn_hidden=96, attn_kernel="sdpa", **kw)
    torch.manual_seed(0)
    model = Transformer(cfg)
    b, t = 2, 16
    x = torch.randint(0, 97, (b, t + 1))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(x[:, :-1], targets=x[:, 1:]).backward()
    assert counter.get_total_flops() == b * t * flops_per_token(cfg, t)


def test_flops_per_token_by_hand_for_moe_local_and_gated_layers():
    """Routed experts count top_k of n_experts (plus the shared one and the router), a
    local layer attends over its window, the gate is one more dim x dim matmul."""
    cfg = tiny(n_layers=4, ffn_hidden=96, local_per_global=3, sliding_window=5,
               attn_gate=True, n_experts=4, top_k=2, n_shared=1, expert_hidden=16,
               n_dense_layers=1)
    attn = 32 * 8 * (2 * 4 + 2 * 2) + 32 * 32  # q, o; k, v (2 kv heads); gate
    dense_ffn = 3 * 32 * 96
    moe_ffn = 3 * 32 * 16 * (2 + 1) + 32 * 4  # top-2 routed + 1 shared; router
    matmul = 4 * attn + dense_ffn + 3 * moe_ffn + 32 * 97
    span = 3 * 5 + 16  # layers 0-2 local (window 5), layer 3 global
    assert flops_per_token(cfg, 16) == 6 * matmul + 12 * 32 * span


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    m = Transformer(tiny(dim=256, n_heads=4, n_kv_heads=4, n_layers=8, init_std=0.02))
    assert m.layers[0].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for layer in m.layers:  # every projection back into the residual stream: 0.02 / sqrt(2 * 8)
        assert layer.attn.wo.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
        assert layer.ffn.w_down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
        assert layer.ffn.w_up.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(m.norm.weight == 1)


def test_no_weight_decay_on_norms():
    m = Transformer(tiny())
    decay, no_decay = param_groups(m, 0.1)
    assert all(p.dim() == 2 for p in decay["params"])
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in m.parameters() if p.dim() == 1}
    assert no_decay["weight_decay"] == 0.0


def test_sequence_longer_than_max_is_refused():
    with pytest.raises(ValueError, match="max_seq_len"):
        Transformer(tiny(max_seq_len=8))(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("name", ["cosine", "wsd", "constant"])
def test_schedules_warm_up_and_end_where_configured(name):
    cfg = load_config(None, [f"schedule.name={name}", "schedule.warmup_steps=10",
                             "schedule.min_lr_ratio=0.1", "train.steps=100"]).schedule
    lrs = [lr_multiplier(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert max(lrs) == pytest.approx(1.0)
    if name == "constant":
        assert lrs[-1] == 1.0
    else:
        assert lrs[-1] == pytest.approx(0.1)
        assert all(a >= b - 1e-12 for a, b in zip(lrs[10:], lrs[11:]))
    if name == "wsd":  # flat until the last 20% of steps
        assert lrs[79] == 1.0 and lrs[81] < 1.0
    if name == "cosine":
        mid = 10 + (99 - 10) / 2
        assert lr_multiplier(int(mid), 100, cfg) == pytest.approx(
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))


def test_stacked_projection_equals_separate_linears_with_gradients():
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.double, requires_grad=True)
    ws = [torch.randn(n, 8, dtype=torch.double, requires_grad=True) for n in (4, 2, 2)]
    stacked = stacked_linear(x, ws)
    torch.testing.assert_close(stacked, torch.cat([x @ w.t() for w in ws], dim=-1))
    assert torch.autograd.gradcheck(lambda x, *ws: stacked_linear(x, list(ws)), (x, *ws))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # casts what autocast casts, as F.linear
        torch.testing.assert_close(stacked_linear(x, ws), torch.cat([F.linear(x, w) for w in ws], -1))
        x32, ws32 = x.float(), [w.float() for w in ws]
        separate = torch.cat([F.linear(x32, w) for w in ws32], -1)
        assert separate.dtype == torch.bfloat16
        torch.testing.assert_close(stacked_linear(x32, ws32), separate)


def test_attention_trains_through_the_stacked_projection_and_decodes_without_it():
    torch.manual_seed(0)
    attn = Attention(32, 4, 2)
    cos, sin = rope_tables(8, 16, 10000.0)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        separate = attn(x, cos, sin)  # inference: one linear per projection
    stacked = attn(x, cos, sin)
    torch.testing.assert_close(stacked, separate)
    stacked.square().sum().backward()
    for w in (attn.wq.weight, attn.wk.weight, attn.wv.weight):
        assert w.grad is not None and w.grad.abs().sum() > 0


def _reference_attention(attn: Attention, x: torch.Tensor, theta: float) -> torch.Tensor:
    """Causal GQA attention written out: RoPE (rotate-half, angles pos * theta^(-2i/d)) on
    both queries and keys, explicit scores and softmax, in float64."""
    b, t, _ = x.shape
    h, kv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    x = x.double()
    q = (x @ attn.wq.weight.double().T).view(b, t, h, d).transpose(1, 2)
    k = (x @ attn.wk.weight.double().T).view(b, t, kv, d).transpose(1, 2)
    v = (x @ attn.wv.weight.double().T).view(b, t, kv, d).transpose(1, 2)
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq  # (t, d/2)
    cos, sin = angle.cos(), angle.sin()

    def rope(z):
        z1, z2 = z[..., : d // 2], z[..., d // 2 :]
        return torch.cat([z1 * cos - z2 * sin, z2 * cos + z1 * sin], dim=-1)

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * d)
    return y @ attn.wo.weight.double().T


def test_attention_matches_a_reference_with_rope_on_queries_and_keys():
    """The module's output equals attention computed by hand with both q and k rotated, in
    training (stacked projection) and inference alike."""
    torch.manual_seed(0)
    attn = Attention(32, 4, 2)
    with torch.no_grad():  # weights big enough that positions move the scores visibly
        for w in (attn.wq.weight, attn.wk.weight):
            w.mul_(8)
    cos, sin = rope_tables(8, 24, 10000.0)
    x = torch.randn(2, 24, 32, requires_grad=True)
    expected = _reference_attention(attn, x, 10000.0).float()
    got = attn(x, cos, sin)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, cos, sin), expected, atol=1e-4, rtol=1e-4)
    # and the training path's gradients (input and every projection) are the reference's
    inputs = (x, attn.wq.weight, attn.wk.weight, attn.wv.weight, attn.wo.weight)
    upstream = torch.randn(2, 24, 32, dtype=torch.float64)
    want = torch.autograd.grad(_reference_attention(attn, x, 10000.0), inputs, upstream)
    for g, w in zip(torch.autograd.grad(got, inputs, upstream.float()), want, strict=True):
        torch.testing.assert_close(g, w.float(), atol=1e-4, rtol=1e-4)


def test_local_attention_with_rope_sees_relative_positions_only():
    """With RoPE on q and k a score depends on i - j only, so a sliding-window layer gives the
    same output for the same last `window` tokens wherever they sit in the sequence. (A
    rotation of the queries alone would make scores depend on absolute position.)"""
    torch.manual_seed(0)
    window, shift = 4, 7
    attn = Attention(32, 4, 2, window=window)
    with torch.no_grad():
        for w in (attn.wq.weight, attn.wk.weight):
            w.mul_(8)
    cos, sin = rope_tables(8, 32, 10000.0)
    content = torch.randn(2, 16, 32)
    shifted = torch.cat([torch.randn(2, shift, 32), content], dim=1)
    with torch.no_grad():
        y = attn(content, cos[:16], sin[:16])
        y_shifted = attn(shifted, cos[: 16 + shift], sin[: 16 + shift])
    torch.testing.assert_close(y_shifted[:, shift + window - 1 :], y[:, window - 1 :],
                               atol=1e-5, rtol=1e-5)
    # and the order inside the window matters (positions are not simply ignored)
    swapped = content.clone()
    swapped[:, [10, 11]] = content[:, [11, 10]]
    with torch.no_grad():
        assert not torch.allclose(attn(swapped, cos[:16], sin[:16])[:, 12], y[:, 12], atol=1e-3)


@pytest.mark.parametrize("name", ["cosine", "wsd"])
@pytest.mark.parametrize(("steps", "warmup"), [(4, 3), (1, 0), (2, 0), (5, 0)])
def test_decaying_schedules_end_at_the_floor_even_with_no_room_to_decay(name, steps, warmup):
    """The last step is at min_lr_ratio whenever warmup is over by then, including a single
    post-warmup step (cosine used to stay at the peak there)."""
    cfg = load_config(None, [f"schedule.name={name}", f"schedule.warmup_steps={warmup}",
                             "schedule.min_lr_ratio=0.1"]).schedule
    assert lr_multiplier(steps - 1, steps, cfg) == pytest.approx(0.1)


def test_schedule_warnings_name_what_the_settings_do():
    from kiln.train.schedule import schedule_warnings

    cosine = load_config(None, ["schedule.warmup_steps=20"]).schedule
    (only,) = schedule_warnings(10, cosine)
    assert "warmup_steps (20) >= train.steps (10)" in only and "ends at 50%" in only
    assert schedule_warnings(100, cosine) == []
    (only,) = schedule_warnings(20, cosine)  # warmup as long as the run: peak at the end
    assert "reaches optim.lr only at the last step" in only and "never reaches" not in only
    wsd = load_config(None, ["schedule.name=wsd", "schedule.warmup_steps=8",
                             "schedule.decay_fraction=0.5"]).schedule
    (only,) = schedule_warnings(10, wsd)
    assert "lasts 2 steps, not the 5" in only
