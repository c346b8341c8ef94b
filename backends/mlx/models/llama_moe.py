"""Llama's decoder layer (its attention as the config makes it: biases, q/k norms before or after the rope, a
partial rope) over DeepSeek's mixture where a layer is sparse and a dense MLP elsewhere, in MLX over a flattened
token batch (the torch file has the same layout): GLM-4.5 / 4.6 / 4.7 (family_glm: q/k/v biases, the rope on part
of each head, V3's router past first_k_dense_replace), Hunyuan MoE (family_hunyuan: softmax routing renormalised,
a shared MLP; every layer sparse), dots.llm1 and Solar Open (family_llama_moe: V3's router).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        super().__init__(cfg, layer_idx, mlp=DeepSeekMoE(cfg) if sparse else MLP(cfg))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
