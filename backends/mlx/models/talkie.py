"""Talkie in MLX over a flattened token batch (maths in app/models/family_talkie.py; the torch file has the same
layout): NanoChat's weightless norms and reversed rope, q times a gain per head, a SiLU-gated MLP, each sublayer's
output times a learned scalar and the normed embedding added back after every block, the logits times a gain.
"""

from __future__ import annotations

import mlx.core as mx

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.llama4 import L2Norm as PlainRMSNorm
from lantern.backends.mlx.paged_attention import AttentionMetadata


class HeadGainAttention(Attention):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, norm=PlainRMSNorm)
        self.head_gain = mx.ones((self.n_heads,))

    def qkv(self, x: mx.array, meta: AttentionMetadata, *args: object) -> tuple[mx.array, mx.array, mx.array]:
        q, k, v = super().qkv(x, meta, *args)
        return q * self.head_gain[:, None].astype(q.dtype), k, v


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, attn=HeadGainAttention(cfg, layer_idx))
        self.input_layernorm = PlainRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn_gain, self.mlp_gain, self.embed_skip = mx.ones((1,)), mx.ones((1,)), mx.ones((1,))

    def __call__(self, x: mx.array, meta: AttentionMetadata, embedded: mx.array) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), meta) * self.attn_gain
        h = h + self.mlp(self.post_attention_layernorm(h)) * self.mlp_gain
        return h + embedded * self.embed_skip


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainRMSNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.model.embed_norm = PlainRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.model.lm_head_gain = mx.ones((1,))

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        h = self.model.embed_norm(self.model.embed_tokens(input_ids))
        x = h
        for layer in self.model.layers:
            x = layer(x, meta, h)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=x.dtype)
        return self.model.norm(x[rows])

    def __call__(self, input_ids: mx.array, meta: AttentionMetadata, logits_idx: mx.array) -> mx.array:
        logits = super().__call__(input_ids, meta, logits_idx)
        return logits * self.model.lm_head_gain.astype(logits.dtype)
