"""OLMo Hybrid decoder in torch over a flattened token batch (maths in app/models/family_olmo_hybrid.py; the same
layout as the MLX file): OLMo 3's post-norm attention layers (models/olmo.py) between Llama-style pre-norm layers
around Qwen3.5's gated delta net (models/qwen3_next.py: its state slots and kernels), whose q, k and v projections
are stacked into one matrix while loading (weights.py, as any qkv_proj's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import RMSNorm, feed_forward
from lantern.backends.torch.models import llama, olmo, qwen3_next
from lantern.backends.torch.parallel import TPGroup


class GatedDeltaNet(qwen3_next.GatedDeltaNet):
    """Qwen3.5's gated delta net with q/k/v loaded into qkv_proj (OLMo Hybrid's separate q_proj / k_proj / v_proj)."""

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__(cfg, state_index)
        self.qkv_proj = self.in_proj_qkv
        del self.in_proj_qkv

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.shape[0]
        mixed, z = self.qkv_proj(x), self.in_proj_z(x)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)


class LinearLayer(nn.Module):
    """Llama's pre-norm layer around the gated delta net."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, state_index: int, tp: TPGroup):
        super().__init__()
        self.linear_attn = GatedDeltaNet(cfg, state_index)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.linear_attn(h, meta, state), residual)
        return self.mlp(h), residual


class AttentionLayer(olmo.DecoderLayer):
    """OLMo 3's layer over its place in the pool (the attention layers only)."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x, residual, meta, None)


def decoder_layer(cfg: ModelConfig, layer_idx: int, tp: TPGroup) -> nn.Module:
    kinds = cfg.linear_attn.linear_layers
    before = sum(kinds[:layer_idx])
    if kinds[layer_idx]:
        return LinearLayer(cfg, layer_idx, before, tp)
    return AttentionLayer(cfg, layer_idx - before, tp)


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = staticmethod(decoder_layer)  # type: ignore[assignment]
    state_cls = qwen3_next.RecurrentState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        return qwen3_next.state_bytes_per_seq(self.cfg, dtype)
