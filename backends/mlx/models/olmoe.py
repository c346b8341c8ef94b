"""OLMoE decoder in MLX over a flattened token batch (maths in app/models/family_olmo.py; the torch file has
the same layout): Llama's decoder layer with OLMo 2's whole-projection q/k norms before the rope
(models/olmo.OlmoAttention), every MLP the routed experts of layers.feed_forward (Qwen2-MoE's softmax router).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.olmo import OlmoAttention


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, attn=OlmoAttention(cfg, layer_idx))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
