"""StableLM decoder for MLX over a flattened token batch (maths in app/models/family_stablelm.py; the torch file has
the same layout): Llama's decoder layer under LayerNorms with biases; q/k/v biases and the partial rope are
layers.Attention's.
"""

from __future__ import annotations

import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
