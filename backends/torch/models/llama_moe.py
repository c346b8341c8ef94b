"""Llama's decoder layer (its attention as the config makes it: q/k norms before or after the rope) over
DeepSeek's mixture where a layer is sparse and a dense MLP elsewhere, in torch over a flattened token batch (the
MLX file has the same layout): Hunyuan MoE (family_hunyuan: softmax routing renormalised, a shared MLP; every
layer sparse) and dots.llm1 (family_dots1: DeepSeek-V3's sigmoid router, shared experts, the first layers dense).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import MLP
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        super().__init__(cfg, layer_idx, tp, mlp=DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
