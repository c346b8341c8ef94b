"""Lara Mini in MLX over a flattened token batch (maths in app/models/family_lara_mini.py; the torch file has the same
layout): Qwen3.5's gated delta net layers, Qwen3's attention with q/k norms on the others (rope on the sliding layers
only, each reading its own layer of the KV pool), DeepSeek's mixture in every layer.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import deepseek, llama, qwen3_next
from lantern.backends.mlx.paged_attention import AttentionMetadata


class Fp32RMSNorm(nn.Module):
    """LaraMiniRMSNorm: the weight applied in float32 and the product rounded once (mx.fast.rms_norm rounds the norm
    first in a half dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x.astype(mx.float32), self.weight.astype(mx.float32), self.eps).astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        before = sum(kinds[:layer_idx])
        if kinds[layer_idx]:
            self.linear_attn = qwen3_next.GatedDeltaNet(cfg, before)
        else:  # (built by its layer's index: its window and rope; its K/V by its order among attention layers)
            self.self_attn = Attention(cfg, layer_idx, norm=Fp32RMSNorm)
            self.kv_index = layer_idx - before
        self.mlp = deepseek.DeepSeekMoE(cfg)
        self.input_layernorm = Fp32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = Fp32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: qwen3_next.RecurrentState) -> mx.array:
        h = self.input_layernorm(x)
        mixer = self.get("linear_attn")
        h = x + (mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta, kv_layer=self.kv_index))
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = Fp32RMSNorm
    state_cls = qwen3_next.RecurrentState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        return qwen3_next.state_bytes_per_seq(self.cfg, dtype)
