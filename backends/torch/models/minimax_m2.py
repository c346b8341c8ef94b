"""MiniMax-M2 decoder in torch over a flattened token batch (maths in app/models/family_minimax.py; the MLX
file has the same layout): Llama's decoder layer with OLMo 2's whole-projection q/k norms before a partial
rope (models/olmo.OlmoAttention), every MLP DeepSeek-V3's sigmoid-routed experts (models/deepseek.DeepSeekMoE).
Tensor parallelism is refused: the q/k norms read every head of a token at once, and the mixture (SparseMoE).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.models.olmo import OlmoAttention
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, attn=OlmoAttention(cfg, layer_idx, tp), mlp=DeepSeekMoE(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:
            raise ValueError(
                "tensor parallelism is not implemented for MiniMax-M2's q/k norms over all heads; "
                "serve this model with --tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)
