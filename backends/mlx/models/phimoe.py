"""PhiMoE (Phi-3.5-MoE) decoder in MLX over a flattened token batch (maths in app/models/family_phimoe.py; the
torch file has the same layout): Llama's decoder layer under LayerNorms with biases, attention biased on q, k, v
and o_proj, Mixtral's experts routed by SparseMixer (moe.sparsemixer); the head's bias is llama.CausalLM's.
"""

from __future__ import annotations

import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, attn=Attention(cfg, layer_idx, o_bias=cfg.attention_bias))
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
