"""Write a Trinity-style Kiln `Transformer` as a Hugging Face `AfmoeForCausalLM` folder.

afmoe (transformers >= 5, `transformers.models.afmoe`) is the architecture of Arcee's
Trinity checkpoints. It hard-wires QK-norm, the sigmoid attention gate and sandwich norms,
applies RoPE on sliding-window layers only (global layers are NoPE), and routes with
sigmoid scores + a selection-only `expert_bias`, gates normalised over the top-K and scaled
by `route_scale` — Kiln's MoE. So a Kiln model with qk_norm, attn_gate and sandwich_norm on
and global_rope off maps onto it tensor for tensor; anything else is refused (see
`afmoe_incompatibilities`) and exported in Kiln's native format instead.

Mapping notes (checked by the logits-parity test):
- layer_types lists Kiln's layer pattern; afmoe's sliding window W lets query i see key j
  when i - j < W, Kiln's local layers when 0 <= i - j < sliding_window: the same W.
- Embedding scaling by sqrt(dim) is afmoe's `mup_enabled`.
- Dense layers are the first `num_dense_layers` (a dense-only model sets all of them).
- Routed experts are written per expert (`mlp.experts.{e}.gate_proj/up_proj/down_proj`), the
  layout of the released Trinity checkpoints, which transformers 5 fuses on load into
  `gate_up_proj` = [gate; up] along dim 1 and `down_proj`. The shared expert is one SwiGLU of
  width moe_intermediate_size * num_shared_experts — Kiln's `n_shared * expert_hidden`.
- The balancer's bias becomes `expert_bias` (fp32); its SMEBU momentum is training state
  and is not exported.

Nothing here imports transformers (only `afmoe_available` looks it up), so export works
offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from kiln.config import ModelConfig
from kiln.export.hf_folder import is_tied, write_hf_folder
from kiln.model.transformer import (
    Transformer,
    expert_hidden_size,
    ffn_hidden_size,
    head_dim,
    is_local_layer,
    is_moe_layer,
)

_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_post_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_mlp_layernorm.weight",
    "ffn_post_norm.weight": "post_mlp_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "attn.wg.weight": "self_attn.gate_proj.weight",
    "ffn.w_gate.weight": "mlp.gate_proj.weight",  # dense layers
    "ffn.w_up.weight": "mlp.up_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
    "ffn.router.weight": "mlp.router.gate.weight",  # MoE layers
    "ffn.shared.w_gate.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared.w_up.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared.w_down.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.balancer.bias": "mlp.expert_bias",
}
_EXPERTS = {"ffn.experts.w_gate": "gate_proj", "ffn.experts.w_up": "up_proj",
            "ffn.experts.w_down": "down_proj"}
_TRAINING_ONLY = ("ffn.balancer.momentum",)


def afmoe_available() -> str | None:
    """None if the installed transformers has the afmoe architecture, else why not."""
    try:
        found = importlib.util.find_spec("transformers.models.afmoe") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "the installed transformers has no afmoe model (needs >= 5.0)"


def layer_types(cfg: ModelConfig) -> list[str]:
    return ["sliding_attention" if is_local_layer(cfg, i) else "full_attention"
            for i in range(cfg.n_layers)]


def afmoe_incompatibilities(cfg: ModelConfig) -> list[str]:
    """Why `cfg` cannot be written as afmoe (empty: it can, exactly)."""
    problems = []
    for key in ("qk_norm", "attn_gate", "sandwich_norm"):
        if not getattr(cfg, key):
            problems.append(f"model.{key} is off (afmoe always has it)")
    if cfg.global_rope and "full_attention" in layer_types(cfg):
        problems.append("model.global_rope is on (afmoe's full-attention layers have no RoPE)")
    if cfg.n_experts and cfg.n_shared < 1 and cfg.n_dense_layers < cfg.n_layers:
        problems.append("model.n_shared = 0 (afmoe MoE layers always have a shared expert)")
    return problems



def _tensor(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU, not copied (see `kiln.export.native.native_state_dict`)."""
    return t.detach().cpu().contiguous()


def afmoe_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """CPU tensors under afmoe checkpoint names; a tied head is left out (HF re-ties it)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "head.weight" and is_tied(model):
            continue
        if name in _TOP:
            out[_TOP[name]] = _tensor(tensor)
            continue
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] != "layers":
            raise KeyError(f"no afmoe name for tensor '{name}'")
        prefix, local = f"model.layers.{parts[1]}", parts[2]
        if local in _TRAINING_ONLY:
            continue
        if local in _EXPERTS:
            for e, matrix in enumerate(tensor):  # (E, out, in): one Linear weight per expert
                out[f"{prefix}.mlp.experts.{e}.{_EXPERTS[local]}.weight"] = _tensor(matrix)
        elif local in _LAYER:
            value = _tensor(tensor)
            out[f"{prefix}.{_LAYER[local]}"] = value.float() if local == "ffn.balancer.bias" else value
        else:  # a new kind of tensor must fail loudly, not be dropped from the export
            raise KeyError(f"no afmoe name for tensor '{name}'")
    return out


def grouped_mm_aligned(cfg: ModelConfig) -> bool:
    """Whether transformers' default afmoe experts kernel can run this model's experts.

    transformers 5 runs afmoe experts through `F.grouped_mm` unless told otherwise, and that
    kernel wants every operand row a multiple of 16 bytes: `dim` and `expert_hidden`
    multiples of 8 in bf16 (4 in fp32). Kiln's own experts fall back to padded matmuls
    there; transformers does not, and fails on the first forward ("strides should be
    multiple of 16 bytes"). A multiple of 8 holds in every dtype a user may load it in."""
    return all(n % 8 == 0 for n in (cfg.dim, expert_hidden_size(cfg)))


def afmoe_config(model: Transformer, eos: int) -> dict[str, Any]:
    """config.json for AfmoeForCausalLM (transformers 5 `rope_parameters` and the older
    top-level `rope_theta`, `dtype` and `torch_dtype`, as the Llama export writes).
    Experts whose rows `grouped_mm` cannot take are written with transformers' per-expert
    loop (`experts_implementation = "eager"`, see `grouped_mm_aligned`)."""
    cfg = model.cfg
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    moe = any(is_moe_layer(cfg, i) for i in range(cfg.n_layers))
    experts = {} if not moe or grouped_mm_aligned(cfg) else {"experts_implementation": "eager"}
    return {
        **experts,
        "architectures": ["AfmoeForCausalLM"],
        "model_type": "afmoe",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_size(cfg),
        "moe_intermediate_size": expert_hidden_size(cfg) if moe else 1,
        "num_hidden_layers": cfg.n_layers,
        "num_dense_layers": cfg.n_dense_layers if moe else cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": head_dim(cfg),
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "num_experts": cfg.n_experts if moe else 1,
        "num_experts_per_tok": cfg.top_k if moe else 1,
        "num_shared_experts": cfg.n_shared if moe else 1,
        "route_scale": cfg.route_scale,
        "global_attn_every_n_layers": cfg.local_per_global + 1,
        # unused when no layer is local; afmoe still builds a sliding mask, so keep it valid
        "sliding_window": cfg.sliding_window if cfg.local_per_global else cfg.max_seq_len,
        "layer_types": layer_types(cfg),
        "mup_enabled": cfg.embed_scale,
        "tie_word_embeddings": is_tied(model),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "output_router_logits": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }



def export_afmoe(model: Transformer, tokenizer_path: Path, out_dir: Path,
                 checkpoint: str | None = None) -> Path:
    """Write config, weights, generation config and tokenizer to `out_dir` atomically.

    Raises ValueError naming every option afmoe cannot represent (nothing is written)."""
    problems = afmoe_incompatibilities(model.cfg)
    if problems:
        raise ValueError("this model cannot be written as Hugging Face afmoe: " + "; ".join(problems))
    return write_hf_folder(model, tokenizer_path, out_dir, afmoe_config, afmoe_state_dict,
                           {"format": "hf-afmoe", "checkpoint": checkpoint})
