"""Hunyuan MoE (Hunyuan-A13B) decoder in MLX over a flattened token batch (maths in app/models/family_hunyuan.py;
the torch file has the same layout): Llama's decoder layer whose attention norms each head's q and k after the
rope (layers.Attention with ModelConfig.qk_norm_after_rope), every MLP DeepSeek-V2's softmax-routed experts,
renormalised, beside an ungated shared MLP (models/deepseek.DeepSeekMoE).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, mlp=DeepSeekMoE(cfg))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
