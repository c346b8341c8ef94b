"""HRM-Text for MLX over a flattened token batch (maths in app/models/family_hrm_text.py; the torch file has the same
layout): the checkpoint's 2 x layers_per_stack layers (the L stack's, then the H stack's) run in cycles, each pass
of a stack reading and writing its own layers of the KV pool (layers.Attention's kv_layer).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class PlainRMSNorm(nn.Module):
    """RMSNorm without a weight, in float32 (HrmTextRMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x.astype(mx.float32), None, self.eps).astype(x.dtype)


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer under weightless norms; attention gated per channel (cfg.attn_output_gate)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.norm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, kv_layer: int) -> mx.array:
        h = x + self.self_attn(self.norm(x), meta, kv_layer=kv_layer)
        return h + self.mlp(self.norm(h))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainRMSNorm  # (each stack's closing norm: the same weightless one)

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.model.z_L_init = mx.zeros((cfg.hidden_size,))

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        cycles, layers = self.cfg.hrm, self.model.layers
        per_stack = cycles.layers_per_stack
        high = self.model.embed_tokens(input_ids) * self.cfg.embed_multiplier
        low = mx.broadcast_to(self.model.z_L_init.astype(high.dtype), high.shape)
        for stack, first in cycles.passes():
            x = low + high
            for i, layer in enumerate(layers[:per_stack] if stack == "L" else layers[per_stack:]):
                x = layer(x, meta, first + i)
            x = self.model.norm(x)
            low, high = (x, high) if stack == "L" else (low, x)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=high.dtype)
        return high[rows]
