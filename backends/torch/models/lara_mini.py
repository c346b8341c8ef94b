"""Lara Mini in torch over a flattened token batch (maths in app/models/family_lara_mini.py; the MLX file has the same
layout): Qwen3.5's gated delta net layers (qwen3_next.GatedDeltaNet and its state slots), Qwen3's attention with q/k
norms on the others (the rope on the sliding layers only), each attention layer reading its own layer of the KV pool
(its order among them); DeepSeek's mixture in every layer (softmax top-k, one ungated shared expert).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import deepseek, llama, qwen3_next
from lantern.backends.torch.parallel import TPGroup


class Fp32RMSNorm(nn.Module):
    """LaraMiniRMSNorm: the weight applied in float32 and the product rounded once (layers.RMSNorm rounds the norm
    first, as Llama's does), called as layers.RMSNorm: (normed x + r, x + r)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x if residual is None else x + residual
        return F.rms_norm(h.float(), (h.shape[-1],), self.weight.float(), self.eps).to(h.dtype), h


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        before = sum(kinds[:layer_idx])
        if kinds[layer_idx]:
            self.linear_attn = qwen3_next.GatedDeltaNet(cfg, before)
        else:  # (built by its layer's index: its window and rope; its K/V by its order among attention layers)
            self.self_attn = Attention(cfg, layer_idx, tp, norm=Fp32RMSNorm)
            self.kv_index = layer_idx - before
        self.mlp = deepseek.DeepSeekMoE(cfg, tp)
        self.input_layernorm = Fp32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = Fp32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        state: qwen3_next.RecurrentState,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "linear_attn", None)
        h = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta, kv_layer=self.kv_index)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = Fp32RMSNorm
    state_cls = qwen3_next.RecurrentState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        return qwen3_next.state_bytes_per_seq(self.cfg, dtype)
