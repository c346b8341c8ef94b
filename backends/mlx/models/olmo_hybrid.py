"""OLMo Hybrid decoder in MLX over a flattened token batch (maths in app/models/family_olmo_hybrid.py; the same
layout as the torch file): OLMo 3's post-norm attention layers (models/olmo.py) between Llama-style pre-norm layers
around Qwen3.5's gated delta net (models/qwen3_next.py: its state slots and kernels) with q, k and v apart.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import feed_forward
from lantern.backends.mlx.models import llama, olmo, qwen3_next
from lantern.backends.mlx.paged_attention import AttentionMetadata


class GatedDeltaNet(qwen3_next.GatedDeltaNet):
    """Qwen3.5's gated delta net with OLMo Hybrid's separate q_proj / k_proj / v_proj."""

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__(cfg, state_index)
        la, d = cfg.linear_attn, cfg.hidden_size
        del self.in_proj_qkv
        self.q_proj = nn.Linear(d, la.num_k_heads * la.k_dim, bias=False)
        self.k_proj = nn.Linear(d, la.num_k_heads * la.k_dim, bias=False)
        self.v_proj = nn.Linear(d, la.num_v_heads * la.v_dim, bias=False)

    def _project(self, x: mx.array) -> tuple[mx.array, ...]:
        t = x.shape[0]
        mixed = mx.concatenate([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        z, b, a = self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)


class LinearLayer(nn.Module):
    """Llama's pre-norm layer around the gated delta net."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, state_index: int):
        super().__init__()
        self.linear_attn = GatedDeltaNet(cfg, state_index)
        self.mlp = feed_forward(cfg, layer_idx)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: Any) -> mx.array:
        h = x + self.linear_attn(self.input_layernorm(x), meta, state)
        return h + self.mlp(self.post_attention_layernorm(h))


class AttentionLayer(olmo.DecoderLayer):
    """OLMo 3's layer over its place in the pool (the attention layers only)."""

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: Any) -> mx.array:
        return super().__call__(x, meta)


def decoder_layer(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    kinds = cfg.linear_attn.linear_layers
    before = sum(kinds[:layer_idx])
    return LinearLayer(cfg, layer_idx, before) if kinds[layer_idx] else AttentionLayer(cfg, layer_idx - before)


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = staticmethod(decoder_layer)  # type: ignore[assignment]
    state_cls = qwen3_next.RecurrentState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        return qwen3_next.state_bytes_per_seq(self.cfg, dtype)
