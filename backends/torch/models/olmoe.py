"""OLMoE decoder in torch over a flattened token batch (maths in app/models/family_olmo.py; the MLX file has
the same layout): Llama's decoder layer with OLMo 2's whole-projection q/k norms before the rope
(models/olmo.OlmoAttention), every MLP the routed experts of layers.feed_forward (Qwen2-MoE's softmax router).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.olmo import OlmoAttention
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, attn=OlmoAttention(cfg, layer_idx, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
