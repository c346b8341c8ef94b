"""Hunyuan MoE (Hunyuan-A13B) decoder in torch over a flattened token batch (maths in app/models/family_hunyuan.py;
the MLX file has the same layout): Llama's decoder layer whose attention norms each head's q and k after the rope
(layers.Attention with ModelConfig.qk_norm_after_rope), every MLP DeepSeek-V2's softmax-routed experts,
renormalised, beside an ungated shared MLP (models/deepseek.DeepSeekMoE).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, mlp=DeepSeekMoE(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
