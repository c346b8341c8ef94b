"""OLMo (1) decoder for MLX over a flattened token batch (maths in app/models/family_olmo1.py; the torch file has
the same layout): Llama's decoder layer under LayerNorms without weights or biases; q, k, v clamped where the
config says (layers.Attention, cfg.clip_qkv).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama


class PlainLayerNorm(nn.Module):
    """LayerNorm with no weight or bias, in float32 (OlmoLayerNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x.astype(mx.float32), None, None, self.eps).astype(x.dtype)


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.input_layernorm = PlainLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = PlainLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainLayerNorm
