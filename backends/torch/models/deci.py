"""Nemotron-NAS / DeciLM decoder in torch over a flattened token batch (maths in app/models/family_deci.py; the
same layout as the MLX file): Llama's layer where each layer has its own attention -- Llama's with its own KV
heads over its own place in the pool, a linear map, or none -- and its own MLP width, or none. A missing
sublayer takes its norm with it, so the residual stream passes by untouched.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class LinearAttention(nn.Module):
    """The 51B's replacement of attention: one hidden x hidden matrix of the normed input (self_attn.linear_attn)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear_attn = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        return self.linear_attn(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        nas, d, eps = cfg.nas, cfg.hidden_size, cfg.rms_norm_eps
        kind, width = nas.attention[layer_idx], nas.mlp_widths[layer_idx]
        if kind == "attention":
            own = replace(cfg, num_kv_heads=nas.kv_heads[layer_idx])
            self.self_attn: nn.Module | None = Attention(own, nas.pool_index(layer_idx), tp)
        else:
            self.self_attn = LinearAttention(cfg) if kind == "linear" else None
        if self.self_attn is not None:
            self.input_layernorm = RMSNorm(d, eps)
        self.mlp = MLP(cfg, tp, intermediate_size=width) if width else None
        if self.mlp is not None:
            self.post_attention_layernorm = RMSNorm(d, eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x is the previous sublayer's output, not yet added to the residual stream (the add is fused into the
        next norm); a layer without a sublayer hands both on as they are."""
        if self.self_attn is not None:
            h, residual = self.input_layernorm(x, residual)
            x = self.self_attn(h, meta)
        if self.mlp is not None:
            h, residual = self.post_attention_layernorm(x, residual)
            x = self.mlp(h)
        return x, residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for a per-layer KV pool by parallel.local_config)
