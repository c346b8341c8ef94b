"""Zamba (v1) in MLX over a flattened token batch (maths in app/models/family_zamba.py; the torch file has the same
layout): every layer a multi-head Mamba-1 mixer block (models/mamba.py's mixer and state slots, one per layer); a
hybrid layer first runs the one shared transformer block on [x, embedding] with its own K/V pool layer, and adds
linear(block output) to its mixer's input.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import mamba
from lantern.backends.mlx.paged_attention import AttentionMetadata


class SharedBlock(nn.Module):
    """Attention over RMSNorm([x, e]) (no rope), then the gated MLP over RMSNorm(attention), no residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(2 * cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 0, input_size=2 * cfg.hidden_size)
        self.pre_ff_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.feed_forward = MLP(cfg)

    def __call__(self, x: mx.array, embedded: mx.array, meta: AttentionMetadata, kv_layer: int) -> mx.array:
        h = self.input_layernorm(mx.concatenate([x, embedded], axis=-1))
        h = self.self_attn(h, meta, kv_layer=kv_layer)
        return self.feed_forward(self.pre_ff_layernorm(h))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.mamba = mamba.Mamba1Mixer(cfg, layer_idx)  # (every layer keeps a state)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        hybrid = cfg.zamba2.hybrid_layers
        self._kv_layer = hybrid.index(layer_idx) if layer_idx in hybrid else None
        if self._kv_layer is not None:
            self.linear = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def __call__(
        self, x: mx.array, embedded: mx.array, meta: AttentionMetadata, state: mamba.MambaState, shared: SharedBlock
    ) -> mx.array:
        h = x if self._kv_layer is None else x + self.linear(shared(x, embedded, meta, self._kv_layer))
        return x + self.mamba(self.input_layernorm(h), meta, state)


class CausalLM(mamba.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.model.shared_transformers = [SharedBlock(cfg)]

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        embedded = self.model.embed_tokens(input_ids)
        h, shared = embedded, self.model.shared_transformers[0]
        for layer in self.model.layers:
            h = layer(h, embedded, meta, self.recurrent, shared)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])
