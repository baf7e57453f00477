"""The decoder-only transformer, assembled from `ModelConfig` (single-device code).

With every option off it is the Llama architecture (pre-norm, RoPE, GQA, SwiGLU). The
Trinity options switch on one at a time: interleaved local/global attention, NoPE global
layers, QK-norm, gated attention, depth-scaled sandwich norm, embedding scaling, and
sigmoid-routed mixture-of-experts FFNs after a dense prefix.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kiln.config import ModelConfig
from kiln.model.fused_loss import linear_cross_entropy
from kiln.model.layers import Attention, KVCache, RMSNorm, SwiGLU, rope_tables
from kiln.model.moe import MoE


def ffn_hidden_size(cfg: ModelConfig) -> int:
    """SwiGLU width: 8/3 of dim (same FLOPs as a 4x GELU MLP), rounded up to 64."""
    if cfg.ffn_hidden:
        return cfg.ffn_hidden
    return 64 * math.ceil(8 * cfg.dim / 3 / 64)


def expert_hidden_size(cfg: ModelConfig) -> int:
    return cfg.expert_hidden or max(64, 64 * round(ffn_hidden_size(cfg) / 4 / 64))


def head_dim(cfg: ModelConfig) -> int:
    """Width of one attention head: `cfg.head_dim`, or dim // n_heads when it is 0."""
    return cfg.head_dim or cfg.dim // cfg.n_heads


def is_local_layer(cfg: ModelConfig, i: int) -> bool:
    """`local_per_global` local layers, then one global layer, repeated."""
    return cfg.local_per_global > 0 and (i + 1) % (cfg.local_per_global + 1) != 0


def is_moe_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.n_experts > 0 and i >= cfg.n_dense_layers


def post_norm_gain(cfg: ModelConfig) -> float:
    """Depth-scaled sandwich norm: post-norm gains start at 1/sqrt(n_layers) (Pangu Ultra's
    depth scaling with c = 1, the reading the Trinity digest gives; the report does not
    print its constant), so each block's branch starts small in deep stacks."""
    return cfg.post_norm_gain or 1.0 / math.sqrt(cfg.n_layers)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        local = is_local_layer(cfg, index)
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(
            cfg.dim, cfg.n_heads, cfg.n_kv_heads, rope=local or cfg.global_rope,
            window=cfg.sliding_window if local else 0, qk_norm=cfg.qk_norm,
            gate=cfg.attn_gate, norm_eps=cfg.norm_eps, kernel=cfg.attn_kernel,
            head_dim=head_dim(cfg),
        )
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if is_moe_layer(cfg, index):
            self.ffn = MoE(
                cfg.dim, expert_hidden_size(cfg), cfg.n_experts, cfg.top_k, cfg.n_shared,
                cfg.route_scale, cfg.balance, cfg.balance_rate, cfg.smebu_beta,
                cfg.smebu_kappa, cfg.seq_aux_coef, cfg.z_loss_coef, cfg.router_init_std,
                cfg.init_std,
            )
        else:
            self.ffn = SwiGLU(cfg.dim, ffn_hidden_size(cfg))
        self.attn_post_norm = RMSNorm(cfg.dim, cfg.norm_eps) if cfg.sandwich_norm else None
        self.ffn_post_norm = RMSNorm(cfg.dim, cfg.norm_eps) if cfg.sandwich_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.attn(self.attn_norm(x), cos, sin, cache, doc_ids)
        if self.attn_post_norm is not None:
            h = self.attn_post_norm(h)
        x = x + h
        h = self.ffn(self.ffn_norm(x))
        if self.ffn_post_norm is not None:
            h = self.ffn_post_norm(h)
        return x + h


class Transformer(nn.Module):
    """Decoder: embeddings, blocks, final RMSNorm, LM head (optionally tied)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (it is taken from the tokenizer)")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(head_dim(cfg), cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) weights; residual output projections scaled by 1/sqrt(2 * layers)
        so the residual stream's variance does not grow with depth (GPT-2 / OLMo style);
        norm gains 1, post-norm gains depth-scaled; MoE layers initialise their own.

        Kiln's choice, not the report's: Trinity draws a truncated normal (sigma 0.009 for
        Large, cut not given) and does not say whether it scales output projections; afmoe's
        init does not. With `sandwich_norm` the two depth scalings stack: a fresh branch's
        mean square (~4e-7 for Trinity Nano's attention) falls under the post-norm's eps
        (1e-5), so the norm does not yet normalise and branches start at 0.37-0.76 of their
        gain (trinity-tiny's shape; 0.19-0.54 Nano's) instead of 0.84-0.98 unscaled. Kept:
        unscaled trained trinity-tiny worse at 60 steps (val 2.331 against 2.271 bits/byte,
        one seed; README, "departs")."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers))
            else:
                nn.init.normal_(p, 0.0, std)
        for layer in self.layers:
            if isinstance(layer.ffn, MoE):
                layer.ffn.reset_parameters(std, self.cfg.router_init_std, self.cfg.n_layers)
            for norm in (layer.attn_post_norm, layer.ffn_post_norm):
                if norm is not None:
                    nn.init.constant_(norm.weight, post_norm_gain(self.cfg))

    def hidden_states(self, tokens: torch.Tensor, caches: list[KVCache] | None = None,
                      doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        start = caches[0].length if caches else 0
        t = tokens.shape[1]
        if start + t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + t} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
        if doc_ids is not None and doc_ids.shape != tokens.shape:
            raise ValueError(f"doc_ids of shape {tuple(doc_ids.shape)} for tokens of shape "
                             f"{tuple(tokens.shape)}: one document id per token")
        cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        x = self.embed(tokens)
        if self.cfg.embed_scale:
            x = x * math.sqrt(self.cfg.dim)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, caches[i] if caches else None, doc_ids)
        return self.norm(x)

    def forward(
        self,
        tokens: torch.Tensor,
        caches: list[KVCache] | None = None,
        targets: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, vocab) for tokens (B, T); with `targets`, the mean next-token
        cross-entropy instead, through the fused head + loss (`fused_loss`), so the full
        (tokens x vocab) logits never exist. With `caches`, positions continue from what
        the caches hold (incremental decoding). With `doc_ids` (B, T), each token attends
        only to its own document (`model.doc_mask`; `kiln.model.doc_mask.document_ids`
        makes them; the callers pass them, the model does not read `cfg.doc_mask`)."""
        x = self.hidden_states(tokens, caches, doc_ids)
        if targets is None:
            return self.head(x)
        y = targets.flatten()
        return linear_cross_entropy(x.flatten(0, 1), self.head.weight, y) / y.numel()

    def aux_loss(self) -> torch.Tensor | None:
        """Sum of the MoE layers' balance and z-losses from the last forward (None if dense,
        or if that forward was in eval mode without gradients, which skips them)."""
        losses = [moe.aux_loss for moe in self.moe_layers() if moe.aux_loss is not None]
        return torch.stack(losses).sum() if losses else None

    def moe_layers(self) -> list[MoE]:
        return [layer.ffn for layer in self.layers if isinstance(layer.ffn, MoE)]

    def new_caches(self, capacity: int | None = None) -> list[KVCache]:
        """One KV cache per layer for `capacity` positions (default and cap: the context);
        size it to prompt + new tokens so a short generation allocates little. A
        sliding-window layer's holds its window alone (a ring)."""
        max_len = self.cfg.max_seq_len
        return [KVCache(min(capacity or max_len, max_len), layer.attn.window)
                for layer in self.layers]


def count_params(model: Transformer) -> dict[str, int]:
    """Total parameters (tied weights once), those outside the token embedding, and the
    active ones per token (routed experts count top_k of n_experts)."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.embed.weight.numel()
    inactive = 0
    for moe in model.moe_layers():
        per_expert = sum(p.numel() for p in moe.experts.parameters()) // moe.n_experts
        inactive += per_expert * (moe.n_experts - moe.top_k)
    return {"params": total, "params_non_embedding": total - embed, "params_active": total - inactive}


def _layer_matmul_params(cfg: ModelConfig, i: int) -> int:
    """Weights multiplied per token in layer i's forward (routed experts: only top_k)."""
    width = head_dim(cfg)
    attn = cfg.dim * width * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    if cfg.attn_gate:
        attn += cfg.dim * cfg.n_heads * width
    if is_moe_layer(cfg, i):
        eh = expert_hidden_size(cfg)
        ffn = 3 * cfg.dim * eh * (cfg.top_k + cfg.n_shared) + cfg.dim * cfg.n_experts
    else:
        ffn = 3 * cfg.dim * ffn_hidden_size(cfg)
    return attn + ffn


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token: 6 x (active matmul parameters) + 12 x (n_heads x head_dim)
    x attended span summed over layers (PaLM's 12 L H Q T; n_heads x head_dim is dim unless
    `head_dim` sets it apart).

    Matmul parameters are every weight multiplied in a forward pass: the blocks (routed
    experts counted top_k times) and the output head (the embedding lookup is a gather).
    The attention term counts QK^T and AV over the attended span — seq_len for global
    layers, min(seq_len, window) for local ones — as the full square (PaLM's convention),
    though a causal kernel does about half.
    """
    matmul = sum(_layer_matmul_params(cfg, i) for i in range(cfg.n_layers)) + cfg.dim * cfg.vocab_size
    span = sum(min(seq_len, cfg.sliding_window) if is_local_layer(cfg, i) else seq_len
               for i in range(cfg.n_layers))
    return 6 * matmul + 12 * cfg.n_heads * head_dim(cfg) * span
