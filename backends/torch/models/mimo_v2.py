"""Xiaomi MiMo-V2-Flash decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_mimo_v2.py): Laguna's layer -- Llama's pre-norms, the sliding layers on a rope table of their own
base and width, DeepSeek's sigmoid router where a layer is sparse -- whose attention (layers.Attention) holds its
layer's own K/V heads, narrower values scaled (ModelConfig.v_head_dim / attn_value_scale) and, on the sliding
layers, a sink logit per head.
"""

from __future__ import annotations

from dataclasses import replace

from lantern.app.models.family_mimo_v2 import layer_kv_heads
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import laguna
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(laguna.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)
        own = replace(cfg, num_kv_heads=layer_kv_heads(cfg, layer_idx))
        self.self_attn = Attention(own, layer_idx, tp, sinks=self.self_attn.window is not None)


class CausalLM(laguna.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for a per-layer KV pool by parallel.local_config)
