"""Phi-1 / 1.5 / 2 decoder for MLX over a flattened token batch (maths in app/models/family_phi.py; the torch file
has the same layout): one LayerNorm with a bias feeding attention (biased, a partial rope) and the ungated GELU
MLP (models/jais2.UngatedMLP) in parallel; the head's bias is llama.CausalLM's.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.jais2 import UngatedMLP
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, o_bias=True)
        self.mlp = UngatedMLP(cfg, bias=True)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = self.input_layernorm(x)
        return x + self.self_attn(h, meta) + self.mlp(h)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
