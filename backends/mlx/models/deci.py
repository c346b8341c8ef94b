"""Nemotron-NAS / DeciLM decoder in MLX over a flattened token batch (maths in app/models/family_deci.py; the
same layout as the torch file): Llama's layer where each layer has its own attention -- Llama's with its own KV
heads over its own place in the pool, a linear map, or none -- and its own MLP width, or none.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class LinearAttention(nn.Module):
    """The 51B's replacement of attention: one hidden x hidden matrix of the normed input (self_attn.linear_attn)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear_attn = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        return self.linear_attn(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        nas, d, eps = cfg.nas, cfg.hidden_size, cfg.rms_norm_eps
        kind, width = nas.attention[layer_idx], nas.mlp_widths[layer_idx]
        self.has_attention, self.has_mlp = kind != "none", width > 0
        if kind == "attention":
            self.self_attn = Attention(replace(cfg, num_kv_heads=nas.kv_heads[layer_idx]), nas.pool_index(layer_idx))
        elif kind == "linear":
            self.self_attn = LinearAttention(cfg)
        if self.has_attention:
            self.input_layernorm = nn.RMSNorm(d, eps=eps)
        if self.has_mlp:
            self.mlp = MLP(cfg, intermediate_size=width)
            self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        if self.has_attention:
            x = x + self.self_attn(self.input_layernorm(x), meta)
        if self.has_mlp:
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
