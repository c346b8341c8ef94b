"""Nanbeige 4.2 in MLX over a flattened token batch (maths in app/models/family_nanbeige.py; the torch file has the
same layout): Llama's layers run num_loops times, each loop's pass of a layer over its own layer of the KV pool.
"""

from __future__ import annotations

import mlx.core as mx

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, attn=Attention(cfg, layer_idx, o_bias=cfg.attention_bias))

    def __call__(self, x: mx.array, meta: AttentionMetadata, kv_layer: int) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), meta, kv_layer=kv_layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        loops, layers = self.cfg.loops, self.model.layers
        h = self.model.embed_tokens(input_ids)
        for loop in range(loops.loops):
            for i, layer in enumerate(layers):
                h = layer(h, meta, loop * len(layers) + i)
            if loops.norm_between and loop < loops.loops - 1:
                h = self.model.norm(h)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])
