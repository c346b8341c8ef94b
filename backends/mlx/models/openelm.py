"""OpenELM in MLX over a flattened token batch (maths in app/models/family_openelm.py; the torch file has the same
layout): Llama's layer with each layer's own query / K/V heads (its own shape in the KV pool) and MLP width.
"""

from __future__ import annotations

from dataclasses import replace

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        blocks = cfg.openelm  # (query heads per layer: cfg.layer_heads, read by Attention)
        own = replace(cfg, num_kv_heads=blocks.kv_heads[layer_idx])
        attn, mlp = Attention(own, layer_idx), MLP(cfg, intermediate_size=blocks.mlp_widths[layer_idx])
        super().__init__(cfg, layer_idx, attn=attn, mlp=mlp)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
