"""Xiaomi MiMo-V2-Flash decoder in MLX (maths in app/models/family_mimo_v2.py; the torch file has the same layout):
the DeepSeek-mixture Llama layer of llama_moe.py whose attention (layers.Attention) holds its layer's own K/V
heads, narrower values scaled (ModelConfig.v_head_dim / attn_value_scale), the sliding layers' window, rope of
their own base and width and a sink logit per head.
"""

from __future__ import annotations

from dataclasses import replace

from lantern.app.models.family_mimo_v2 import layer_kv_heads
from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama_moe


class DecoderLayer(llama_moe.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        own = replace(cfg, num_kv_heads=layer_kv_heads(cfg, layer_idx))
        self.self_attn = Attention(own, layer_idx, sinks=self.self_attn.window is not None)


class CausalLM(llama_moe.CausalLM):
    decoder_layer = DecoderLayer
