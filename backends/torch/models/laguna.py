"""Poolside Laguna decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_laguna.py): Mellum's layer -- Llama's pre-norms, its sliding layers on a rope table of their own
base and width -- whose attention (layers.Attention, from the config) has per-layer query heads and the softplus
output gate, over DeepSeek's sigmoid router where a layer is sparse (its logits tanh-capped where the config says).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import MLP
from lantern.backends.torch.models import mellum
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(mellum.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        super().__init__(cfg, layer_idx, tp, mlp=DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp))


class CausalLM(mellum.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
