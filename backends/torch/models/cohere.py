"""Cohere Command R7B / Command A (cohere2) and Command R / R+ / Aya (cohere) decoder in torch over a flattened
token batch, the same layout as the MLX file (maths in app/models/family_cohere.py): one LayerNorm per layer
feeding attention and MLP in parallel, the rope on consecutive pairs (Cohere Compass: the halves) and (cohere2) only
on the sliding layers
(layers.Attention with rope_interleaved and ModelConfig.rope_layers), logits scaled (ModelConfig.logits_divisor);
Cohere2-MoE's mixture where a layer is sparse (deepseek.DeepSeekMoE: its routing is DeepSeek's).

Tensor parallelism works as for Llama: attention and MLP all-reduce their outputs before they are added.
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


class CohereLayerNorm(nn.Module):
    """(x - mean) / std * weight in float32, no bias, with the residual add fused in like layers.RMSNorm."""

    def __init__(self, dim: int | tuple[int, int], eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed x + residual, x + residual)."""
        h = x if residual is None else x + residual
        hf = h.float()
        hf = hf - hf.mean(-1, keepdim=True)
        normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return normed.to(h.dtype), h


class CohereAttention(Attention):
    """layers.Attention (pair-wise rope); Command R+'s q/k norms are LayerNorms with a weight per head
    ([heads, head_dim], broadcast over the tokens)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)  # (pairs or halves: ModelConfig.rope_interleaved)
        if cfg.qk_norm:
            self.q_norm = CohereLayerNorm((self.n_heads, self.head_dim), cfg.rms_norm_eps)
            self.k_norm = CohereLayerNorm((self.n_kv, self.head_dim), cfg.rms_norm_eps)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = CohereAttention(cfg, layer_idx, tp)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)  # (Cohere2-MoE: DeepSeek's mixture computes it)
        self.mlp = DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        self.input_layernorm = cohere_norm(cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        return self.self_attn(h, meta) + self.mlp(h), residual


def cohere_norm(dim: int, eps: float, rms: bool = False) -> nn.Module:
    """The family's LayerNorm, or an RMSNorm where the config says so (Cohere2-MoE's rms_norm_eps)."""
    return RMSNorm(dim, eps) if rms else CohereLayerNorm(dim, eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = CohereLayerNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        if cfg.rms_norm:
            self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
