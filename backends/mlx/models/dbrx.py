"""DBRX decoder for MLX over a flattened token batch (maths in app/models/family_dbrx.py; the torch file has the
same layout): Llama's pre-norm layer under LayerNorms with a weight only, the clamp of q/k/v (layers.Attention,
cfg.clip_qkv) and Mixtral's mixture in every layer (layers.feed_forward).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.mpt import WeightOnlyLayerNorm


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.input_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = WeightOnlyLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = WeightOnlyLayerNorm
