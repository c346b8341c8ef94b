"""Arcee Trinity (AFMoE) decoder in MLX over a flattened token batch (the same layout as the torch file; maths in
app/models/family_afmoe.py): layers.Attention with its per-head q/k norms, the sigmoid output gate and no rope on
the full-attention layers (all read from ModelConfig), Gemma 2's sandwich of plain RMSNorms, and DeepSeek's mixture
(without expert groups) past the first dense layers.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        self.mlp = DeepSeekMoE(cfg) if sparse else MLP(cfg)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.pre_feedforward_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_feedforward_layernorm = nn.RMSNorm(d, eps=eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), meta))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
