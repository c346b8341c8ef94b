"""Gemma 4 (text) decoder over a flattened token batch (maths in app/models/family_gemma4.py; the same
layout as the torch file): layers of two shapes over a KV pool whose layers differ in shape, K/V
shared by the last layers, per-layer embeddings, and the 26B-A4B's experts beside the dense MLP.

A KV-sharing layer reads the pool layer of its source (kv_sources) and this step's K/V that layer
computed (handed on per layer type through the forward pass), and writes nothing.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, MLP
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention
from lantern.backends.mlx.rope import FreqRoPE, build_rope

SharedKV = dict[str, tuple[mx.array, mx.array]]


class RMSNorm(nn.Module):
    """x / rms(x) times the weight (none: scale-free), in float32, then x's dtype (Gemma4RMSNorm)."""

    def __init__(self, dims: int, eps: float = 1e-6, scale: bool = True):
        super().__init__()
        if scale:
            self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        weight = self.get("weight")
        scale = None if weight is None else weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), scale, self.eps).astype(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        g4 = cfg.gemma4
        self.sliding = g4.is_sliding(layer_idx)
        self.layer_type = g4.layer_types[layer_idx]
        self.kv_index, self.writes = g4.kv_sources[layer_idx], g4.writes_kv(layer_idx)
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None
        d, eps, heads = cfg.hidden_size, cfg.rms_norm_eps, cfg.num_heads
        self.n_heads = heads
        self.head_dim = cfg.head_dim if self.sliding else g4.global_head_dim
        self.n_kv = cfg.num_kv_heads if self.sliding else g4.global_kv_heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps)
        if self.writes:
            self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
            if self.sliding or not g4.k_eq_v:
                self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
            self.k_norm = RMSNorm(self.head_dim, eps)
            self.v_norm = RMSNorm(self.head_dim, eps, scale=False)
        if self.sliding:
            self.rope = build_rope(self.head_dim, cfg.rope_theta, False, None, cfg.max_position_embeddings)
        else:
            with np.errstate(divide="ignore"):  # pairs that do not turn: an infinite period
                self.rope = FreqRoPE(self.head_dim, g4.global_inv_freq(), False)

    def _rotate(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        return self.rope(x[:, :, None, :], offset=meta.positions)[:, :, 0, :]

    def __call__(self, x: mx.array, meta: AttentionMetadata, shared: SharedKV) -> mx.array:
        t = x.shape[0]
        q = self._rotate(self.q_norm(self.q_proj(x).reshape(t, self.n_heads, self.head_dim)), meta)
        if self.writes:
            k = self.k_proj(x).reshape(t, self.n_kv, self.head_dim)
            v = self.v_proj(x).reshape(t, self.n_kv, self.head_dim) if "v_proj" in self else k
            k, v = self._rotate(self.k_norm(k), meta), self.v_norm(v)
            shared[self.layer_type] = (k, v)
        else:
            k, v = shared[self.layer_type]
        out = paged_attention(q, k, v, meta, self.kv_index, 1.0, window=self.window, write=self.writes)
        return self.o_proj(out.reshape(t, -1))


class MLPWithExperts(MLP):
    """The dense MLP (called as MLP) with the routed experts beside it: their parameters under the same
    `mlp`, as family_gemma4.checkpoint_name names them."""

    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__(cfg, width)
        from lantern.backends.mlx.moe import Experts

        d = cfg.hidden_size
        self.top_k = cfg.moe.top_k
        self.gate = nn.Linear(d, cfg.moe.num_experts, bias=False)
        self.router_scale = mx.ones((d,))
        self.per_expert_scale = mx.ones((cfg.moe.num_experts,))
        self.router_norm = RMSNorm(d, cfg.rms_norm_eps, scale=False)
        self.experts = Experts(cfg)

    def route(self, residual: mx.array) -> tuple[mx.array, mx.array]:
        h = self.router_norm(residual) * self.router_scale * (residual.shape[-1] ** -0.5)
        probs = mx.softmax(self.gate(h).astype(mx.float32), axis=-1)
        k = self.top_k
        ids = mx.argpartition(-probs, kth=k - 1, axis=-1)[:, :k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True)
        return ids, weights * self.per_expert_scale[ids]

    def routed(self, x: mx.array, residual: mx.array) -> mx.array:
        ids, weights = self.route(residual)
        return (self.experts(x, ids) * weights[..., None]).astype(x.dtype).sum(axis=1)  # products in float32


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        g4, d, eps = cfg.gemma4, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer_idx)
        self.moe = cfg.moe is not None
        self.mlp = (MLPWithExperts if self.moe else MLP)(cfg, g4.mlp_widths[layer_idx])
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
            setattr(self, name, RMSNorm(d, eps))
        self.post_feedforward_layernorm = RMSNorm(d, eps)
        if self.moe:
            self.post_feedforward_layernorm_1 = RMSNorm(d, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(d, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(d, eps)
        self.act = ACTIVATIONS[cfg.hidden_act]
        if g4.ple_dim:
            self.per_layer_input_gate = nn.Linear(d, g4.ple_dim, bias=False)
            self.per_layer_projection = nn.Linear(g4.ple_dim, d, bias=False)
            self.post_per_layer_input_norm = RMSNorm(d, eps)
        self.layer_scalar = mx.ones((1,))

    def __call__(self, x: mx.array, meta: AttentionMetadata, shared: SharedKV, ple: mx.array | None) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), meta, shared))
        if self.moe:
            dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
            routed = self.mlp.routed(self.pre_feedforward_layernorm_2(h), h)
            ffn = dense + self.post_feedforward_layernorm_2(routed)
        else:
            ffn = self.mlp(self.pre_feedforward_layernorm(h))
        h = h + self.post_feedforward_layernorm(ffn)
        if ple is not None:
            g = self.per_layer_projection(self.act(self.per_layer_input_gate(h)) * ple)
            h = h + self.post_per_layer_input_norm(g)
        return h * self.layer_scalar.astype(h.dtype)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = RMSNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        g4 = cfg.gemma4
        if g4.ple_dim:
            width = cfg.num_layers * g4.ple_dim
            self.model.embed_tokens_per_layer = nn.Embedding(g4.ple_vocab, width)
            self.model.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            self.model.per_layer_projection_norm = RMSNorm(g4.ple_dim, cfg.rms_norm_eps)

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        cfg = self.cfg
        h = self.model.embed_tokens(input_ids)
        h = h * mx.array(cfg.hidden_size**0.5, dtype=h.dtype)
        ple = self._per_layer_inputs(input_ids, h)
        shared: SharedKV = {}
        for i, layer in enumerate(self.model.layers):
            h = layer(h, meta, shared, None if ple is None else ple[:, i])
        if rows.size == 0:
            return mx.zeros((0, cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])

    def _per_layer_inputs(self, input_ids: mx.array, h: mx.array) -> mx.array | None:
        """[T, layers, ple]: the token's own per-layer embedding plus a projection of its embedding."""
        g4, m = self.cfg.gemma4, self.model
        if not g4.ple_dim:
            return None
        t, shape = h.shape[0], (h.shape[0], self.cfg.num_layers, g4.ple_dim)
        ids = mx.where(input_ids < g4.ple_vocab, input_ids, 0)  # ids past its table (3n's media) read row 0
        table = m.embed_tokens_per_layer(ids)
        table = table.reshape(shape) * mx.array(g4.ple_dim**0.5, dtype=table.dtype)
        proj = m.per_layer_model_projection(h) * (self.cfg.hidden_size**-0.5)
        proj = m.per_layer_projection_norm(proj.reshape(shape))
        return ((proj + table.astype(proj.dtype)) * (2.0**-0.5)).reshape(t, *shape[1:])
