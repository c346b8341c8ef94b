"""Arcee Trinity (AFMoE) decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_afmoe.py): layers.Attention with its per-head q/k norms, the sigmoid output gate and no rope on
the full-attention layers (all read from ModelConfig), Gemma 2's sandwich of plain RMSNorms, and DeepSeek's mixture
(without expert groups) past the first dense layers.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        self.mlp = DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.post_feedforward_layernorm = RMSNorm(d, eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's normed MLP output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        attn = self.post_attention_layernorm(self.self_attn(h, meta))[0]
        h, residual = self.pre_feedforward_layernorm(attn, residual)
        return self.post_feedforward_layernorm(self.mlp(h))[0], residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
