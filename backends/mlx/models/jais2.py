"""Jais 2 decoder in MLX over a flattened token batch (maths in app/models/family_jais2.py; the torch file has the
same layout): Llama's decoder layer under LayerNorms with biases, attention biased on q, k, v and o_proj, and
Nemotron's ungated relu^2 MLP with biases (models/nemotron_h.Relu2MLP).
"""

from __future__ import annotations

import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.nemotron_h import Relu2MLP


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        attn = Attention(cfg, layer_idx, o_bias=cfg.attention_bias)
        super().__init__(cfg, layer_idx, attn=attn, mlp=Relu2MLP(cfg, bias=cfg.mlp_bias))
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
