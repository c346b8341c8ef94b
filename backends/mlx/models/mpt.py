"""MPT decoder for MLX over a flattened token batch (maths in app/models/family_mpt.py; the torch file has the same
layout): Jais 2's sequential layer without any bias, under LayerNorms with a weight only; ALiBi in the attention
(layers.Attention, cfg.alibi_slopes).
"""

from __future__ import annotations

import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import jais2, llama


class WeightOnlyLayerNorm(nn.LayerNorm):
    def __init__(self, dims: int, eps: float):
        super().__init__(dims, eps=eps, bias=False)


class DecoderLayer(jais2.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.input_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = WeightOnlyLayerNorm
