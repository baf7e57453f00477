"""Intra-document attention masking (`model.doc_mask`): packed documents against a reference
forward with an explicit boolean mask in fp64, on both kernels and sliding-window layers;
independence of documents; gradients; the setting off; config and wiring."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import kiln.model.matmul_attention as ma
from kiln.config import ConfigError, ModelConfig, load_config
from kiln.data.loader import eval_batches, masking_eos_id
from kiln.eval.perplexity import evaluate
from kiln.model import Transformer
from kiln.model.doc_mask import document_ids
from kiln.model.layers import Attention
from kiln.model.transformer import Block, is_local_layer
from kiln.train.resume_settings import changed_model_settings
from kiln.train.trainer import Trainer

EOS = 0
LENGTHS = (11, 17, 9)  # three documents, each ended by EOS (the last one cut by the window)


def packed(lengths=LENGTHS, seed: int = 0, batch: int = 2) -> tuple[torch.Tensor, list[int]]:
    """(B, T) tokens of documents of `lengths`, each ending with EOS but the last; the start
    of each document. Row 1 holds other tokens (and the same boundaries shifted by one)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(batch):
        row = []
        for n in lengths[:-1] if r == 0 else (lengths[0] + 1, *lengths[1:-1]):
            row += torch.randint(1, 50, (n - 1,), generator=g).tolist() + [EOS]
        rows.append(row + torch.randint(1, 50, (sum(lengths) - len(row),), generator=g).tolist())
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return torch.tensor(rows), starts


def reference_mask(tokens: torch.Tensor, window: int) -> torch.Tensor:
    """(B, T, T) keys visible from each query, built by walking the tokens: j <= i, no EOS
    at positions j..i-1 (the same document), and within the window on local layers."""
    b, t = tokens.shape
    mask = torch.zeros(b, t, t, dtype=torch.bool)
    for r in range(b):
        for i in range(t):
            for j in range(i, -1, -1):
                if j < i and tokens[r, j] == EOS:
                    break
                if window and i - j >= window:
                    break
                mask[r, i, j] = True
    return mask


def reference_attention(attn: Attention, x, cos, sin, mask) -> torch.Tensor:
    """Attention sublayer by hand: softmax(q k^T / sqrt(d) masked) v."""
    b, t, _ = x.shape
    d = attn.head_dim
    q = attn.wq(x).view(b, t, attn.n_heads, d)
    k = attn.wk(x).view(b, t, attn.n_kv_heads, d)
    v = attn.wv(x).view(b, t, attn.n_kv_heads, d)
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if attn.rope:
        def rot(z):
            half = d // 2
            z1, z2 = z[..., :half], z[..., half:]
            return z * cos + torch.cat([-z2, z1], dim=-1) * sin
        q, k = rot(q), rot(k)
    rep = attn.n_heads // attn.n_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
    if attn.wg is not None:
        y = y * torch.sigmoid(attn.wg(x))
    return attn.wo(y)


def reference_logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    t = tokens.shape[1]
    cos, sin = model.rope_cos[:t].double(), model.rope_sin[:t].double()
    x = model.embed(tokens)
    if cfg.embed_scale:
        x = x * math.sqrt(cfg.dim)
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, Block)
        mask = reference_mask(tokens, cfg.sliding_window if is_local_layer(cfg, i) else 0)
        h = reference_attention(layer.attn, layer.attn_norm(x), cos, sin, mask)
        if layer.attn_post_norm is not None:
            h = layer.attn_post_norm(h)
        x = x + h
        h = layer.ffn(layer.ffn_norm(x))
        if layer.ffn_post_norm is not None:
            h = layer.ffn_post_norm(h)
        x = x + h
    return model.head(model.norm(x))


def trinity_like(kernel: str, window: int) -> Transformer:
    """Local and global layers, QK-norm, gate, sandwich norm, GQA; fp64."""
    cfg = ModelConfig(vocab_size=50, dim=32, n_layers=4, n_heads=4, n_kv_heads=2,
                      max_seq_len=64, local_per_global=1, sliding_window=window, qk_norm=True,
                      attn_gate=True, sandwich_norm=True, attn_kernel=kernel, doc_mask=True)
    torch.manual_seed(0)
    return Transformer(cfg).double()


@pytest.fixture(params=[ma.BLOCK, 5], ids=["block-64", "block-5"])
def block(request, monkeypatch):
    """The matmul kernel with its own block size and with blocks of 5 (several blocks, a
    window that crosses them)."""
    monkeypatch.setattr(ma, "BLOCK", request.param)
    return request.param


# window 8 < T = 37: the banded blocks (with padding); window 48 > T: the short path
SHAPES = [pytest.param(8, id="window-8"), pytest.param(48, id="window-over-T")]


@pytest.mark.parametrize("window", SHAPES)
@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_packed_logits_equal_the_explicit_mask_reference(kernel, window, block):
    model = trinity_like(kernel, window)
    tokens, _ = packed()
    want = reference_logits(model, tokens)
    with torch.set_grad_enabled(kernel == "matmul"):  # the matmul path is a training path
        got = model(tokens, doc_ids=document_ids(tokens, EOS))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the documents do matter here: plain causal attention is another function
    assert not torch.allclose(model(tokens), want, atol=1e-4)


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_gradients_equal_the_reference(kernel, block):
    model = trinity_like(kernel, 8)
    tokens, _ = packed()
    weights = torch.randn(*tokens.shape, 50, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(1))
    (model(tokens, doc_ids=document_ids(tokens, EOS)) * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (reference_logits(model, tokens) * weights).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("precision", ["fp64", "bf16"])
@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_a_token_changed_in_one_document_leaves_the_others_unchanged(kernel, precision):
    """Document B's logits are bit-identical whatever document A holds, on the training
    path (gradients on; bf16 autocast where asked); A's own logits do change."""
    model = trinity_like(kernel, 8)
    if precision == "bf16":
        model = model.float()
    tokens, starts = packed()
    edited = tokens.clone()
    edited[:, 3] = 7 if tokens[0, 3] != 7 else 8  # inside document A in both rows (not EOS)
    a, b = slice(0, starts[1] + 1), slice(starts[1] + 1, None)  # row 1's A is one longer
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        logits = [model(x, doc_ids=document_ids(x, EOS)) for x in (tokens, edited)]
        plain = [model(x) for x in (tokens, edited)]
    assert torch.equal(logits[0][:, b], logits[1][:, b])
    assert not torch.equal(logits[0][:, a], logits[1][:, a])
    assert not torch.equal(plain[0][:, b], plain[1][:, b])  # unmasked, B sees A


def test_document_ids_give_the_eos_to_the_document_it_ends():
    tokens = torch.tensor([[5, 0, 6, 7, 0, 0, 8], [0, 1, 2, 3, 4, 5, 6]])
    assert document_ids(tokens, 0).tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]


def test_off_is_the_plain_model_bit_for_bit():
    """doc_ids=None (the setting off) runs exactly the unmasked code; one document's ids
    give the causal function (other kernels: equal within rounding)."""
    model = trinity_like("matmul", 8).float()
    tokens = torch.randint(1, 50, (2, 37), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(model(tokens, doc_ids=None), model(tokens))
    one = torch.zeros_like(tokens)
    torch.testing.assert_close(model(tokens, doc_ids=one), model(tokens), rtol=1e-5, atol=1e-5)


def test_doc_ids_are_refused_with_a_kv_cache_or_the_wrong_shape():
    model = trinity_like("sdpa", 8)
    tokens, _ = packed()
    with pytest.raises(ValueError, match="one document id per token"):
        model(tokens, doc_ids=document_ids(tokens[:, :5], EOS))
    with pytest.raises(ValueError, match="KV cache"):
        model(tokens[:1], model.new_caches(), doc_ids=document_ids(tokens[:1], EOS))


def test_config_takes_a_bool_and_a_resume_cannot_switch_it():
    assert load_config(None, []).model.doc_mask is False
    assert load_config(None, ["model.doc_mask=true"]).model.doc_mask is True
    with pytest.raises(ConfigError, match="model.doc_mask: expected bool"):
        load_config(None, ["model.doc_mask=1"])
    with pytest.raises(ConfigError, match="model.doc_mask: expected bool"):
        load_config(None, ['model.doc_mask="yes"'])
    old, new = load_config(None, []), load_config(None, ["model.doc_mask=true"])
    assert changed_model_settings(old, new) == ["model.doc_mask: False -> True"]


def test_shards_without_an_eos_id_are_refused_when_masking(tiny_run):
    token_dir = tiny_run / "tokens"
    assert masking_eos_id(token_dir, False) is None
    assert masking_eos_id(token_dir, True) == json.loads((token_dir / "index.json").read_text())[
        "eos_id"]
    index = json.loads((token_dir / "index.json").read_text())
    del index["eos_id"]
    (token_dir / "index.json").write_text(json.dumps(index))
    assert masking_eos_id(token_dir, False) is None
    with pytest.raises(ConfigError, match=r"model.doc_mask.*index.json records none"):
        masking_eos_id(token_dir, True)


@pytest.mark.parametrize("doc_mask", [False, True])
def test_trainer_and_eval_mask_by_the_shards_eos(tiny_run, monkeypatch, doc_mask):
    """The trainer passes document ids made with the shards' EOS when the setting is on,
    and none when off; eval masks as training did."""
    seen = []
    forward = Transformer.forward

    def spy(self, tokens, caches=None, targets=None, doc_ids=None):
        seen.append((tokens.clone(), doc_ids))
        return forward(self, tokens, caches, targets, doc_ids)

    monkeypatch.setattr(Transformer, "forward", spy)
    cfg = tiny_config(tiny_run, "train.steps=1", "train.eval_every=0",
                      f"model.doc_mask={str(doc_mask).lower()}")
    trainer = Trainer(cfg, resume=False)
    trainer.train_step()
    eos = json.loads((tiny_run / "tokens" / "index.json").read_text())["eos_id"]
    assert seen and all(tokens.shape[1] == cfg.train.seq_len for tokens, _ in seen)
    for tokens, docs in seen:
        if doc_mask:
            assert torch.equal(docs, document_ids(tokens, eos))
        else:
            assert docs is None

    seen.clear()
    model = trainer.raw_model.eval()
    got = evaluate(model, tiny_run / "tokens", "val", 32, 2, 1, torch.device("cpu"), "fp32",
                   doc_mask=doc_mask)
    (batch,) = eval_batches(tiny_run / "tokens", "val", 32, 2, 1)
    docs = document_ids(batch[:, :-1], eos) if doc_mask else None
    with torch.no_grad():
        logits = forward(model, batch[:, :-1], doc_ids=docs)
    want = F.cross_entropy(logits.flatten(0, 1).double(), batch[:, 1:].flatten()).item()
    assert got["loss"] == pytest.approx(want, rel=1e-5)


def test_hf_export_is_kept_and_says_it_masks_causally_only(tiny_run, tmp_path):
    """A model trained with doc_mask exports as Llama (not refused); the note says what
    transformers does not do; its logits for one document are the masked model's."""
    transformers = pytest.importorskip("transformers")
    from kiln.data.tokenizer import load_tokenizer
    from kiln.export import export_model

    tokenizer = tiny_run / "tokenizer" / "tokenizer.json"
    vocab = load_tokenizer(tokenizer).get_vocab_size()
    cfg = tiny_config(tiny_run, "model.doc_mask=true")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4,
                                    n_kv_heads=2, max_seq_len=48, doc_mask=True)).eval()
    result = export_model(model, tokenizer, tmp_path / "hf", cfg)
    assert result.format == "hf-llama"
    assert "intra-document masking" in result.note and "one document" in result.note
    plain = export_model(Transformer(dataclasses.replace(model.cfg, doc_mask=False)), tokenizer,
                         tmp_path / "hf-plain", cfg)
    assert "intra-document" not in plain.note
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    eos = masking_eos_id(tiny_run / "tokens", True)
    one = torch.tensor([[5, 17, 40, 2, 9, eos]])  # one document, its EOS included
    with torch.no_grad():
        ours = model(one, doc_ids=document_ids(one, eos))
        torch.testing.assert_close(hf(one).logits, ours, rtol=1e-4, atol=1e-4)
