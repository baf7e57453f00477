"""Trinity export: AfmoeForCausalLM reproduces Kiln's logits; other mixes go native and back."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub import

import dataclasses  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import tiny_config  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from kiln.cli import main  # noqa: E402
from kiln.config import ConfigError  # noqa: E402
from kiln.data.tokenizer import EOS_TOKEN, load_tokenizer  # noqa: E402
from kiln.export import export_afmoe, export_hf, export_model, load_native  # noqa: E402
from kiln.export.earlier import other_files  # noqa: E402
from kiln.model import Transformer  # noqa: E402

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.afmoe")

TRINITY = ["model.dim=32", "model.n_layers=5", "model.n_heads=4", "model.n_kv_heads=2",
           "model.max_seq_len=48", "model.local_per_global=2", "model.sliding_window=5",
           "model.global_rope=false", "model.qk_norm=true", "model.attn_gate=true",
           "model.sandwich_norm=true", "model.embed_scale=true", "model.tie_embeddings=false",
           "model.n_experts=6", "model.n_dense_layers=1", "model.top_k=2", "model.n_shared=2",
           "model.expert_hidden=16", "model.ffn_hidden=40", "model.route_scale=1.7",
           "model.norm_eps=1e-6", "model.rope_theta=500.0"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def main():\n    return 42\n", "The quick brown fox."] * 10,
                            trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def build(tmp_path, tokenizer_path, *extra: str):
    """(config, model): random weights far from init — post-norm and QK gains not 1, a
    nonzero expert bias large enough to change which experts are picked."""
    cfg = tiny_config(tmp_path / "run", *TRINITY, *extra)
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))
    torch.manual_seed(1)
    model = Transformer(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
        for moe in model.moe_layers():
            moe.balancer.bias.copy_(0.5 * torch.randn_like(moe.balancer.bias))
            moe.balancer.momentum.fill_(1e-3)
    return cfg, model.eval()


def tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 30), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("extra", [(), ("model.tie_embeddings=true",), ("model.n_experts=0",),
                                   ("model.local_per_global=0", "model.sliding_window=0"),
                                   # rows of 24 and 136 bytes: transformers' default grouped_mm
                                   # experts refuse them, so the export asks for its eager loop
                                   ("model.expert_hidden=6",),
                                   ("model.dim=34", "model.n_heads=1", "model.n_kv_heads=1"),
                                   # heads wider than dim / n_heads, as Trinity Large's
                                   ("model.head_dim=16",)],
                         ids=["moe", "tied", "dense-trinity", "all-global", "unaligned-experts",
                              "unaligned-dim", "head-dim"])
def test_afmoe_logits_match_kiln(tmp_path, tokenizer_path, extra):
    cfg, model = build(tmp_path, tokenizer_path, *extra)
    result = export_model(model, tokenizer_path, tmp_path / "hf", cfg)
    assert result.format == "hf-afmoe"
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        result.path, output_loading_info=True)
    assert type(hf).__name__ == "AfmoeForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    x = tokens(cfg.model.vocab_size)
    with torch.no_grad():
        ours, theirs = model(x), hf.eval()(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    if model.moe_layers():  # the bias really changes routing here, so dropping it would fail
        for moe in model.moe_layers():
            moe.balancer.bias.zero_()
        with torch.no_grad():
            assert (model(x) - theirs).abs().max().item() > 1e-2



def test_afmoe_cached_generation_past_the_window_matches_kiln(tmp_path, tokenizer_path):
    """transformers' own KV-cached generate on the export (its sliding-window cache on the
    local layers) picks Kiln's greedy tokens: 30 new tokens from a 3-token prompt run six
    windows of 5 past the prompt, through MoE layers with a nonzero bias."""
    cfg, model = build(tmp_path, tokenizer_path)
    path = export_model(model, tokenizer_path, tmp_path / "hf", cfg).path
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    seq = tokens(cfg.model.vocab_size)[:1, :3]
    with torch.no_grad():
        theirs = hf.generate(seq, max_new_tokens=30, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        for _ in range(30):  # Kiln's greedy choice, from full forwards (no cache)
            seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], dim=1)
    assert theirs.tolist() == seq.tolist()

def test_afmoe_files_layout(tmp_path, tokenizer_path):
    cfg, model = build(tmp_path, tokenizer_path)
    out = export_afmoe(model, tokenizer_path, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention",
                                     "sliding_attention", "sliding_attention"]
    assert (config["sliding_window"], config["num_dense_layers"], config["mup_enabled"]) == (5, 1, True)
    weights = load_file(str(out / "model.safetensors"))
    layer = model.layers[1].ffn
    torch.testing.assert_close(weights["model.layers.1.mlp.experts.4.up_proj.weight"],
                               layer.experts.w_up[4], rtol=0, atol=0)
    assert weights["model.layers.1.mlp.expert_bias"].dtype == torch.float32
    assert not any("momentum" in k for k in weights)
    assert (out / "tokenizer.json").is_file()
    assert other_files(out) is None  # a re-export replaces it without archiving it


def test_unrepresentable_model_goes_native_and_round_trips(tmp_path, tokenizer_path):
    cfg, model = build(tmp_path, tokenizer_path, "model.global_rope=true", "model.qk_norm=false")
    result = export_model(model, tokenizer_path, tmp_path / "out", cfg)
    assert result.format == "kiln-native"
    assert "model.global_rope" in result.note and "model.qk_norm" in result.note
    meta = json.loads((result.path / "kiln_export.json").read_text())
    assert "global_rope" in meta["reason"]
    assert other_files(result.path) is None  # a re-export replaces it without archiving it
    back = load_native(result.path)
    x = tokens(cfg.model.vocab_size)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    for a, b in zip(model.state_dict().items(), back.state_dict().items()):
        assert a[0] == b[0] and torch.equal(a[1], b[1])
    assert back.cfg == model.cfg


def test_native_round_trip_with_tied_embeddings(tmp_path, tokenizer_path):
    cfg, model = build(tmp_path, tokenizer_path, "model.sandwich_norm=false",
                       "model.tie_embeddings=true")
    result = export_model(model, tokenizer_path, tmp_path / "out", cfg)
    back = load_native(result.path)
    assert result.format == "kiln-native" and back.head.weight is back.embed.weight
    x = tokens(cfg.model.vocab_size)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))


def test_plain_llama_still_exports_as_llama(tmp_path, tokenizer_path):
    cfg = tiny_config(tmp_path / "run", "model.max_seq_len=48")
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    model = Transformer(dataclasses.replace(cfg.model, vocab_size=vocab))
    assert export_model(model, tokenizer_path, tmp_path / "hf", cfg).format == "hf-llama"


def test_heads_apart_from_a_dim_n_heads_does_not_divide_go_native_not_to_an_unloadable_llama(
        tmp_path, tokenizer_path):
    """dim 36 with 8 heads of 8 (model.head_dim) is a Llama computation, but transformers'
    LlamaConfig refuses a hidden size its head count does not divide: the Llama folder was
    written, said to load with AutoModelForCausalLM, and failed to load. It goes native (and
    back exactly); afmoe, which has no such rule, still takes the Trinity form of it."""
    dims = ("model.dim=36", "model.n_heads=8", "model.n_kv_heads=2", "model.head_dim=8")
    cfg, model = build(tmp_path, tokenizer_path, *dims, "model.n_experts=0", "model.qk_norm=false",
                       "model.attn_gate=false", "model.sandwich_norm=false", "model.global_rope=true",
                       "model.local_per_global=0", "model.sliding_window=0", "model.embed_scale=false")
    with pytest.raises(ValueError, match="model.dim = 36 is not a multiple of model.n_heads = 8"):
        export_hf(model, tokenizer_path, tmp_path / "hf")
    result = export_model(model, tokenizer_path, tmp_path / "out", cfg)
    assert result.format == "kiln-native" and "model.dim = 36" in result.note
    x = tokens(cfg.model.vocab_size)
    with torch.no_grad():
        assert torch.equal(load_native(result.path)(x), model(x))
    cfg, model = build(tmp_path, tokenizer_path, *dims)
    result = export_model(model, tokenizer_path, tmp_path / "trinity", cfg)
    assert result.format == "hf-afmoe"
    with torch.no_grad():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(result.path).eval()(x).logits
        assert (theirs - model(x)).abs().max().item() < 1e-4


@pytest.mark.parametrize("extra, fmt", [
    (("model.n_experts=0", "model.qk_norm=false", "model.attn_gate=false",
      "model.sandwich_norm=false", "model.global_rope=true", "model.local_per_global=0",
      "model.sliding_window=0", "model.embed_scale=false"), "hf-llama"),
    ((), "hf-afmoe"), (("model.qk_norm=false",), "kiln-native")])
def test_an_export_writes_the_models_own_tensors_not_a_copy_of_them(
        tmp_path, tokenizer_path, monkeypatch, extra, fmt):
    """Every export copied the whole state dict before writing it: its peak memory was the
    model twice (a 407 MB model's export added 411 MB), so a model that fit in memory to
    load could fail to export. The weights written are the model's own memory."""
    import kiln.export.hf_folder as hf_folder
    import kiln.export.native as native

    cfg, model = build(tmp_path, tokenizer_path, *extra)
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
             for t in model.state_dict().values()]
    written = {}
    for module in (hf_folder, native):
        real = module.save_tensors
        monkeypatch.setattr(module, "save_tensors",
                            lambda tensors, path, real=real, **kw: (written.update(tensors),
                                                                    real(tensors, path, **kw)))
    assert export_model(model, tokenizer_path, tmp_path / "out", cfg).format == fmt
    copied = [name for name, t in written.items()
              if not any(start <= t.data_ptr() < end for start, end in spans)]
    assert written and not copied


def test_llama_export_refuses_trinity_options(tmp_path, tokenizer_path):
    _, model = build(tmp_path, tokenizer_path, "model.n_experts=0", "model.qk_norm=false",
                     "model.attn_gate=false", "model.sandwich_norm=false")
    with pytest.raises(ValueError, match="global_rope.*embed_scale|local_per_global"):
        export_hf(model, tokenizer_path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_afmoe_export_refuses_what_it_cannot_hold(tmp_path, tokenizer_path):
    _, model = build(tmp_path, tokenizer_path, "model.attn_gate=false")
    with pytest.raises(ValueError, match="attn_gate"):
        export_afmoe(model, tokenizer_path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_load_native_names_what_is_missing(tmp_path, tokenizer_path):
    cfg, model = build(tmp_path, tokenizer_path, "model.qk_norm=false")
    out = export_model(model, tokenizer_path, tmp_path / "out", cfg).path
    (out / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_native(out)


def test_native_export_rejects_an_inconsistent_config(tmp_path, tokenizer_path):
    cfg, model = build(tmp_path, tokenizer_path, "model.qk_norm=false")
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=4096))
    with pytest.raises(ConfigError, match="seq_len"):
        export_model(model, tokenizer_path, tmp_path / "out", bad)
    assert not (tmp_path / "out").exists()


def test_cli_export_of_a_trained_trinity_run(tiny_run):
    overrides = [o for o in TRINITY if "norm_eps" not in o and "rope_theta" not in o]
    args = [a for o in [*overrides, "train.steps=2"] for a in ("--set", o)]
    assert main(["train", str(tiny_run), *args]) == 0
    assert main(["export", str(tiny_run), *args]) == 0
    config = json.loads((tiny_run / "export" / "config.json").read_text())
    assert config["model_type"] == "afmoe"
