"""The preallocated KV cache: written in place, sized per generation, and decoding through
it gives the tokens a full recompute gives, for every attention variant."""

from __future__ import annotations

import pytest
import torch
from linear_time import assert_linear

from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.model.layers import KVCache
from kiln.model.sampling import _next_token, generate

BASE = dict(vocab_size=61, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=48,
            init_std=0.3)  # large weights: peaked, distinct logits
VARIANTS = {
    "gqa": {},
    "mha": dict(n_kv_heads=4),
    "sliding": dict(local_per_global=3, sliding_window=5),  # prompts are longer than 5
    "nope": dict(local_per_global=1, sliding_window=4, global_rope=False),
    "qk_norm": dict(qk_norm=True),
    "gate_sandwich": dict(attn_gate=True, sandwich_norm=True, embed_scale=True),
    "moe": dict(n_experts=4, n_dense_layers=1, top_k=2, expert_hidden=16, route_scale=2.0,
                tie_embeddings=False),
}


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**BASE, **kw})).eval()


@torch.no_grad()
def _generate_without_cache(model: Transformer, prompt: list[int], n: int, temperature: float,
                            generator: torch.Generator | None) -> list[int]:
    """The reference: every token from a full forward over the whole sequence so far."""
    seq = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([seq]))[0, -1]
        seq.append(_next_token(logits, temperature, 0, 1.0, generator))
    return seq[len(prompt):]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_decoding_gives_the_tokens_of_a_full_recompute(variant, temperature):
    model = _model(**VARIANTS[variant])
    prompt = [int(t) for t in torch.randint(0, BASE["vocab_size"], (11,))]
    n = BASE["max_seq_len"] - len(prompt)  # up to the full context
    cached = generate(model, prompt, n, temperature=temperature,
                      generator=torch.Generator().manual_seed(3))
    full = _generate_without_cache(model, prompt, n, temperature,
                                   torch.Generator().manual_seed(3))
    assert cached == full


def test_generate_allocates_once_for_prompt_plus_new_tokens(monkeypatch):
    """The buffers are made once, for what this generation can reach, and written in place:
    every step's keys land in the same storage."""
    model = _model()
    made: list[list[KVCache]] = []
    real = model.new_caches

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(model, "new_caches", spy)
    pointers: list[int] = []
    layer = model.layers[0].attn
    hook = layer.register_forward_hook(lambda *_: pointers.append(made[0][0].k.data_ptr()))
    generate(model, [1, 2, 3], 10, temperature=0.0)
    hook.remove()
    (caches,) = made
    assert [c.capacity for c in caches] == [13] * BASE["n_layers"]
    assert caches[0].k.shape[2] == 13 and len(set(pointers)) == 1 and len(pointers) == 10
    # capped at the context
    assert generate(model, [1, 2, 3], 1000, temperature=0.0)
    assert made[1][0].capacity == BASE["max_seq_len"]


def test_the_prefill_makes_the_logits_of_the_last_prompt_position_alone():
    """Only the last position's logits are sampled: the head never sees the prompt's other
    rows, whose logits (prompt x vocabulary) would be the prefill's largest tensor."""
    model = _model()
    rows: list[int] = []
    hook = model.head.register_forward_hook(lambda mod, args, out: rows.append(out.numel()))
    prompt = list(range(20))
    out = generate(model, prompt, 5, temperature=0.0)
    hook.remove()
    assert rows == [BASE["vocab_size"]] * 5
    assert out == _generate_without_cache(model, prompt, 5, 0.0, None)


def test_a_full_cache_refuses_more_positions():
    cache = KVCache(4)
    kv = torch.zeros(1, 2, 3, 8)
    cache.update(kv, kv)
    with pytest.raises(ValueError, match="4 positions cannot hold 6"):
        cache.update(kv, kv)
    assert cache.length == 3


def test_a_cache_refuses_another_batch():
    """Written in place, a batch of 1 would broadcast over a cache of 2 rows without a word
    (concatenating refused it): each row's keys would become the one row's."""
    cache = KVCache(4)
    kv = torch.zeros(2, 2, 1, 8)
    cache.update(kv, kv)
    one = torch.ones(1, 2, 1, 8)
    with pytest.raises(ValueError, match=r"\(2, 2\), got \(1, 2\): reset it"):
        cache.update(one, one)
    assert cache.length == 1 and not cache.k[:, :, :1].any()


def test_filling_the_cache_token_by_token_is_linear():
    """Each step writes one position: appending n tokens costs O(n), where concatenating
    copied everything held so far on every step (O(n^2))."""
    step = torch.randn(1, 1, 1, 8)

    def fill(n: int) -> None:
        cache = KVCache(n)
        for _ in range(n):
            cache.update(step, step)

    assert_linear(fill, lambda n: n, 256, "KVCache.update")


@pytest.mark.parametrize("variant", ["sliding", "nope"])
@pytest.mark.parametrize("prompt_len", [1, 3, 11])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sliding_window_layers_cache_their_window_alone_with_the_same_tokens(
        variant, prompt_len, temperature, monkeypatch):
    """A local layer's cache is a ring of `window` slots, not the whole generation's; the
    tokens are a full recompute's, from prompts shorter and longer than the window."""
    model = _model(**VARIANTS[variant])
    windows = [layer.attn.window for layer in model.layers]
    made: list[list[KVCache]] = []
    real = model.new_caches
    monkeypatch.setattr(model, "new_caches", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    prompt = [int(t) for t in torch.randint(0, BASE["vocab_size"], (prompt_len,))]
    n = BASE["max_seq_len"] - prompt_len
    cached = generate(model, prompt, n, temperature=temperature,
                      generator=torch.Generator().manual_seed(3))
    assert cached == _generate_without_cache(model, prompt, n, temperature,
                                             torch.Generator().manual_seed(3))
    assert [c.k.shape[2] for c in made[0]] == [w or BASE["max_seq_len"] for w in windows]


@torch.no_grad()
def test_a_ring_returns_the_last_window_to_the_bit():
    """Step by step, the ring gives attention exactly the keys the whole cache's last
    `window` positions are (in position order until it is full, then in slot order: channel
    0 tags each key with its position to compare the sets), prompt (longer or shorter than
    the window) then tokens."""
    for prompt in (2, 7):
        full, ring = KVCache(30), KVCache(30, window=4)
        steps = [torch.randn(1, 2, prompt, 8)] + [torch.randn(1, 2, 1, 8) for _ in range(20)]
        at = 0
        for kv in steps:
            kv[..., 0] = torch.arange(at, at + kv.shape[2])
            at += kv.shape[2]
            fk, _ = full.update(kv, kv)
            rk, rv = ring.update(kv, -kv)
            want = fk if kv.shape[2] > 1 else fk[:, :, -4:]
            order = rk[0, 0, :, 0].argsort()
            assert torch.equal(rk[:, :, order], want) and torch.equal(rv[:, :, order], -want)
        assert ring.length == full.length == prompt + 20 and ring.k.shape[2] == 4
    with pytest.raises(ValueError, match="one token at a time"):
        ring.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))


@torch.no_grad()
def test_a_full_ring_is_attended_where_it_lies():
    """Once full, a decoding step attends to the ring's own buffers, in slot order: putting
    them in position order copied the window twice per layer and step, for an attention
    that is the same under any order of its keys."""
    ring = KVCache(30, window=4)
    ring.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    for _ in range(10):
        k, v = ring.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        if ring.length > 4:
            assert k.data_ptr() == ring.k.data_ptr() and v.data_ptr() == ring.v.data_ptr()
            assert k.shape[2] == v.shape[2] == 4
        else:  # not yet full: the filled slots alone, the empty ones never attended
            assert k.shape[2] == ring.length
