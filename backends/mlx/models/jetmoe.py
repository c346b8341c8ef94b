"""JetMoE in MLX over a flattened token batch (maths in app/models/family_jetmoe.py; the torch file has the same
layout): Llama's layer with a mixture of attention heads (MoA: routed query and output projections around one
shared K/V) and a mixture of SiLU-gated experts, each plus a bias.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.moe import SparseMoE
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention
from lantern.backends.mlx.rope import build_rope


class MixtureOfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        moe, d = cfg.moe, cfg.hidden_size
        self._layer, self._k, self._kv, self._head_dim = layer_idx, moe.top_k, cfg.num_kv_heads, cfg.head_dim
        width = self._kv * self._head_dim
        self.router = nn.Linear(d, moe.num_experts, bias=False)
        self.q_experts = mx.zeros((moe.num_experts, width, d))
        self.o_experts = mx.zeros((moe.num_experts, d, width))
        self.o_bias = mx.zeros((d,))
        self.kv_proj = nn.Linear(d, 2 * width, bias=False)
        self.rope = build_rope(cfg.head_dim, cfg.rope_theta, False, cfg.rope_scaling, cfg.max_position_embeddings)
        self._scale = cfg.head_dim**-0.5

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        t, (experts, width, _) = x.shape[0], self.q_experts.shape
        k_, kv, hd = self._k, self._kv, self._head_dim
        logits = self.router(x).astype(mx.float32)
        ids = mx.argpartition(-logits, kth=k_ - 1, axis=-1)[:, :k_]  # (slot order is immaterial: each is whole)
        weights = mx.softmax(mx.take_along_axis(logits, ids, axis=-1), axis=-1).astype(x.dtype)
        # Every expert's queries (experts / k times the work of the chosen ones, in one matmul), then the chosen
        queries = (x @ self.q_experts.reshape(experts * width, -1).T).reshape(t, experts, width)
        q = mx.take_along_axis(queries, ids[..., None], axis=1).reshape(t, k_ * kv, hd)
        k, v = mx.split(self.kv_proj(x).reshape(t, 2 * kv, hd), 2, axis=1)
        q = self.rope(q[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        k = self.rope(k[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        # slot-major heads (slot s, K/V head j) -> head-major, so the pool's grouping pairs head j with K/V head j
        q = q.reshape(t, k_, kv, hd).transpose(0, 2, 1, 3).reshape(t, -1, hd)
        out = paged_attention(q, k, v, meta, self._layer, self._scale)
        out = out.reshape(t, kv, k_, hd).transpose(0, 2, 1, 3).reshape(t, k_, width)
        # each slot's output through its expert's W_o (gathered per token and slot), weighted, summed
        w = self.o_experts.swapaxes(1, 2)
        rows = mx.expand_dims(out, -2)  # [T, k, 1, width]
        if rows.dtype != mx.float32 and mx.default_device().type != mx.DeviceType.gpu:  # (CPU gather_mm: float32)
            y = mx.gather_mm(rows.astype(mx.float32), w.astype(mx.float32), rhs_indices=ids).astype(x.dtype)
        else:
            y = mx.gather_mm(rows, w, rhs_indices=ids)
        return (y.squeeze(-2) * weights[..., None]).sum(axis=1) + self.o_bias


class BiasedMoE(SparseMoE):
    """The routed experts (a softmax over the k chosen logits) plus the layer's bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, softmax_after_topk=True)
        self.bias = mx.zeros((cfg.hidden_size,))

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(x) + self.bias


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MixtureOfAttention(cfg, layer_idx)
        self.mlp = BiasedMoE(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)  # (JetMoeRMSNorm's default in the layers)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
