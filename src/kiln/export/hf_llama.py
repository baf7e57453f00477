"""Write a Kiln `Transformer` as a Hugging Face `LlamaForCausalLM` folder.

Kiln's blocks are Llama's (pre-norm RMSNorm with fp32 statistics, rotate-half RoPE, GQA,
SwiGLU, no biases), so export is a renaming of tensors: no q/k permutation is needed, which
the logits-parity test checks. Nothing here imports transformers, so export works offline
and without it installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kiln.config import ModelConfig
from kiln.export.hf_folder import is_tied, write_hf_folder
from kiln.model.transformer import Transformer, ffn_hidden_size, head_dim

_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w_gate.weight": "mlp.gate_proj.weight",
    "ffn.w_up.weight": "mlp.up_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
}


_NOT_LLAMA = {  # ModelConfig switches whose non-default value LlamaForCausalLM cannot express
    "local_per_global": "sliding-window (local) layers",
    "global_rope": "position-free (NoPE) global layers",
    "qk_norm": "QK-norm",
    "attn_gate": "gated attention",
    "sandwich_norm": "sandwich (post) norms",
    "embed_scale": "embedding scaling by sqrt(dim)",
    "n_experts": "mixture-of-experts FFNs",
}


def llama_incompatibilities(cfg: ModelConfig) -> list[str]:
    """Why `cfg` is not a plain Llama decoder (empty: it is, and exports as one).

    A Trinity option that has no weights of its own (NoPE, a sliding window, embedding
    scaling) would otherwise export silently as a different model. Heads set apart from
    dim (`model.head_dim`) at a dim that n_heads does not divide compute as Llama would,
    but transformers' LlamaConfig refuses to load them ("hidden size is not a multiple of
    the number of attention heads"), so such a folder would be written and never load."""
    plain = ModelConfig()
    problems = [f"model.{key} = {getattr(cfg, key)!r} ({what})" for key, what in _NOT_LLAMA.items()
                if getattr(cfg, key) != getattr(plain, key)]
    if cfg.dim % cfg.n_heads:
        problems.append(f"model.dim = {cfg.dim} is not a multiple of model.n_heads = {cfg.n_heads} "
                        "(transformers' LlamaConfig refuses that, model.head_dim or not)")
    return problems



def _hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
    # a new kind of parameter must fail loudly, not be dropped from the export
    raise KeyError(f"no Hugging Face Llama name for parameter '{name}'")


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's CPU tensors themselves (no copy: see `native_state_dict`) under HF Llama
    names; a tied head is left out (HF re-ties lm_head)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "head.weight" and is_tied(model):
            continue
        out[_hf_name(name)] = tensor.detach().cpu().contiguous()
    return out


def hf_config(model: Transformer, eos: int) -> dict[str, Any]:
    """config.json for LlamaForCausalLM.

    RoPE is written both as transformers 5's `rope_parameters` and as the older top-level
    `rope_theta` (and dtype as both `dtype` and `torch_dtype`) so 4.x and 5.x read the same.
    """
    cfg = model.cfg
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_size(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": head_dim(cfg),
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": is_tied(model),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }



def export_hf(model: Transformer, tokenizer_path: Path, out_dir: Path,
              checkpoint: str | None = None) -> Path:
    """Write config, weights, generation config and tokenizer to `out_dir`; returns it.

    The folder is assembled beside `out_dir` and swapped in at the end, so an existing
    export is replaced only by a complete one.
    """
    problems = llama_incompatibilities(model.cfg)
    if problems:
        raise ValueError("not a plain Llama model, refusing a LlamaForCausalLM export that would "
                         "compute something else: " + "; ".join(problems)
                         + " (kiln.export.export_model picks afmoe or Kiln's native format)")
    return write_hf_folder(model, tokenizer_path, out_dir, hf_config, hf_state_dict,
                           {"format": "hf-llama", "checkpoint": checkpoint})
