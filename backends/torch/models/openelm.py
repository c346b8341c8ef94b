"""OpenELM in torch over a flattened token batch (maths in app/models/family_openelm.py; the MLX file has the same
layout): Llama's layer with each layer's own query / K/V heads (its own shape in the KV pool) and MLP width.
"""

from __future__ import annotations

from dataclasses import replace

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import MLP, Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        blocks = cfg.openelm  # (query heads per layer: cfg.layer_heads, read by Attention)
        own = replace(cfg, num_kv_heads=blocks.kv_heads[layer_idx])
        attn, mlp = Attention(own, layer_idx, tp), MLP(cfg, tp, intermediate_size=blocks.mlp_widths[layer_idx])
        super().__init__(cfg, layer_idx, tp, attn=attn, mlp=mlp)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for a per-layer KV pool by parallel.local_config)
