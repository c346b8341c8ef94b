"""MPT decoder in torch over a flattened token batch (maths in app/models/family_mpt.py; the MLX file has the same
layout): Jais 2's sequential layer without any bias, under LayerNorms with a weight only; ALiBi in the attention
(layers.Attention, cfg.alibi_slopes).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import LayerNorm
from lantern.backends.torch.models import jais2, llama
from lantern.backends.torch.parallel import TPGroup


class WeightOnlyLayerNorm(LayerNorm):
    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps, bias=False)


class DecoderLayer(jais2.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)
        self.input_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = WeightOnlyLayerNorm
