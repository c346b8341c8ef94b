"""Jais 2 and StarCoder2 decoder in MLX over a flattened token batch (maths in app/models/family_jais2.py and
family_starcoder2.py; the torch file has the same layout): Llama's decoder layer under LayerNorms with biases,
attention biased on q, k, v and o_proj, and an ungated MLP with biases: Nemotron's relu^2 (Jais 2), GELU (StarCoder2).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.nemotron_h import Relu2MLP


class UngatedMLP(Relu2MLP):
    """down(act(up(x))): Jais 2's relu^2, StarCoder2's GELU (tanh) (cfg.hidden_act)."""

    def __init__(self, cfg: ModelConfig, bias: bool):
        super().__init__(cfg, bias=bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.up_proj(x)))


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        attn = Attention(cfg, layer_idx, o_bias=cfg.attention_bias if cfg.attn_out_bias is None else cfg.attn_out_bias)
        super().__init__(cfg, layer_idx, attn=attn, mlp=UngatedMLP(cfg, bias=cfg.mlp_bias))
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
