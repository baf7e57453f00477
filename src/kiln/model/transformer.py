"""The dense decoder-only transformer, assembled from `ModelConfig` (single-device code)."""

from __future__ import annotations

import math

import torch
from torch import nn

from kiln.config import ModelConfig
from kiln.model.layers import Attention, KVCache, RMSNorm, SwiGLU, rope_tables


def ffn_hidden_size(cfg: ModelConfig) -> int:
    """SwiGLU width: 8/3 of dim (same FLOPs as a 4x GELU MLP), rounded up to 64."""
    if cfg.ffn_hidden:
        return cfg.ffn_hidden
    return 64 * math.ceil(8 * cfg.dim / 3 / 64)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg.dim, cfg.n_heads, cfg.n_kv_heads)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.dim, ffn_hidden_size(cfg))

    def forward(self, x, cos, sin, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """Pre-norm decoder: RMSNorm, RoPE, GQA, SwiGLU, optional tied embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (it is taken from the tokenizer)")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) weights; residual output projections scaled by 1/sqrt(2 * layers)
        so the residual stream's variance does not grow with depth (GPT-2 / OLMo style)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(
        self, tokens: torch.Tensor, caches: list[KVCache] | None = None
    ) -> torch.Tensor:
        """Logits (B, T, vocab) for tokens (B, T). With `caches`, positions continue
        from what the caches already hold (incremental decoding)."""
        start = caches[0].length if caches else 0
        t = tokens.shape[1]
        if start + t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + t} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, caches[i] if caches else None)
        return self.head(self.norm(x))

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


def count_params(model: Transformer) -> dict[str, int]:
    """Total parameters (tied weights once) and those outside the token embedding."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.embed.weight.numel()
    return {"params": total, "params_non_embedding": total - embed}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token: 6 x (matmul parameters) + 12 x layers x dim x seq_len.

    Matmul parameters are every weight multiplied in a forward pass: the blocks and the
    output head (the embedding lookup is a gather). The attention term counts QK^T and AV
    for the full T x T square (PaLM's convention), though a causal kernel does about half.
    """
    head_dim = cfg.dim // cfg.n_heads
    attn = cfg.dim * head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    ffn = 3 * cfg.dim * ffn_hidden_size(cfg)
    matmul_params = cfg.n_layers * (attn + ffn) + cfg.dim * cfg.vocab_size
    return 6 * matmul_params + 12 * cfg.n_layers * cfg.dim * seq_len
