"""IQuest-Coder-V1 Loop in MLX over a flattened token batch (maths in app/models/family_iquest_loop.py; the torch file
has the same layout): Llama's layers run twice; the second pass mixes attention to the first pass's K/V (pool layer
i) with a sliding window over its own (pool layer num_layers + i) by a per-head gate of the query.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention

KV = tuple[mx.array, mx.array]


class LoopGate(nn.Module):
    """sigmoid(q . weight[h] + bias[h]) per token and head: [T, H, 1] from the rotated queries [T, H, D]."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = mx.zeros((heads, head_dim))
        self.bias = mx.zeros((heads,))

    def __call__(self, q: mx.array) -> mx.array:
        return mx.sigmoid((q * self.weight.astype(q.dtype)).sum(-1) + self.bias.astype(q.dtype))[..., None]


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        attn = Attention(cfg, layer_idx, o_bias=cfg.attention_bias)  # (attention_bias: o_proj's too)
        super().__init__(cfg, layer_idx, attn=attn)
        attn.loop_gate = LoopGate(attn.n_heads, attn.head_dim)
        self._window, self._second = cfg.loop_window, cfg.num_layers + layer_idx  # (leading _: not parameters)

    def first_pass(self, x: mx.array, meta: AttentionMetadata) -> tuple[mx.array, KV]:
        """Llama's layer over pool layer i; also this step's K/V, which the second pass attends to."""
        a = self.self_attn
        q, k, v = a.qkv(self.input_layernorm(x), meta)
        out = paged_attention(q, k, v, meta, a.layer_idx, a.scale)
        h = x + a.o_proj(out.reshape(x.shape[0], -1))
        return h + self.mlp(self.post_attention_layernorm(h)), (k, v)

    def second_pass(self, x: mx.array, meta: AttentionMetadata, first: KV) -> mx.array:
        a = self.self_attn
        q, k, v = a.qkv(self.input_layernorm(x), meta)
        gate = a.loop_gate(q)
        # (write False: the first pass wrote these K/V to pool layer i; a prefill without a prefix reads them here)
        whole = paged_attention(q, first[0], first[1], meta, a.layer_idx, a.scale, write=False)
        local = paged_attention(q, k, v, meta, self._second, a.scale, window=self._window)
        h = x + a.o_proj((gate * whole + (1 - gate) * local).reshape(x.shape[0], -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        h = self.model.embed_tokens(input_ids)
        firsts = []
        for layer in self.model.layers:
            h, kv = layer.first_pass(h, meta)
            firsts.append(kv)
        for layer, kv in zip(self.model.layers, firsts):
            h = layer.second_pass(h, meta, kv)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])
