from kiln.model.layers import KVCache
from kiln.model.moe import MoE
from kiln.model.transformer import Transformer, count_params, ffn_hidden_size, flops_per_token

__all__ = ["KVCache", "MoE", "Transformer", "count_params", "ffn_hidden_size", "flops_per_token"]
