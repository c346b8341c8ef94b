"""Qwen3-Next / Qwen3.5 (dense and MoE) decoder in MLX over a flattened token batch (maths in
app/models/family_qwen3_next.py; the torch file has the same layout and says how the recurrent state
is kept): gated DeltaNet layers with a per-sequence state, gated full attention over the paged pool.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import gated_delta
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.gemma import GemmaRMSNorm
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention


class GatedAttention(Attention):
    """Each head's query and output gate come from q_proj side by side; output times sigmoid(gate)."""

    def __init__(self, cfg: ModelConfig, kv_index: int):
        super().__init__(cfg, kv_index, norm=GemmaRMSNorm)  # layer_idx: its K/V's place in the pool
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * cfg.num_heads * cfg.head_dim, bias=False)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        t, hd = x.shape[0], self.head_dim
        qg = self.q_proj(x).reshape(t, self.n_heads, 2 * hd)
        q, gate = self.q_norm(qg[..., :hd]), qg[..., hd:].reshape(t, -1)
        k = self.k_norm(self.k_proj(x).reshape(t, self.n_kv, hd))
        v = self.v_proj(x).reshape(t, self.n_kv, hd)
        q = self.rope(q[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        k = self.rope(k[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        out = paged_attention(q, k, v, meta, self.layer_idx, self.scale)
        return self.o_proj(out.reshape(t, -1) * mx.sigmoid(gate))


class GatedNorm(nn.Module):
    """RMSNorm of each head's output times its weight, then times SiLU(z) (transformers' order)."""

    def __init__(self, dim: int, eps: float, fp32: bool = False):
        """fp32: the weight applied in float32 and the product rounded once (Lara Mini's), not after the norm."""
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps, self.fp32 = eps, fp32

    def __call__(self, x: mx.array, z: mx.array) -> mx.array:
        xf = x.astype(mx.float32)
        normed = xf * mx.rsqrt((xf * xf).mean(-1, keepdims=True) + self.eps)
        weight = self.weight.astype(mx.float32) if self.fp32 else self.weight
        return (weight * (normed if self.fp32 else normed.astype(x.dtype)) * nn.silu(z.astype(mx.float32))).astype(
            x.dtype
        )


class RecurrentState:
    """Per linear layer: convolution windows [slots, conv_dim, K-1] and delta-rule states [slots, Hv, dk, dv]."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        la = cfg.linear_attn
        n = sum(la.linear_layers)
        self.conv = [mx.zeros((slots, la.conv_dim, la.conv_kernel - 1), dtype=dtype) for _ in range(n)]
        self.ssm = [mx.zeros((slots, la.num_v_heads, la.k_dim, la.v_dim), dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.conv + self.ssm


def state_bytes_per_seq(cfg: ModelConfig, dtype: mx.Dtype) -> int:
    conv, ssm = cfg.linear_attn.state_elements()
    return sum(cfg.linear_attn.linear_layers) * (conv * dtype.size + ssm * 4)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        la = cfg.linear_attn
        self.state_index = state_index
        self.nk, self.nv, self.dk, self.dv = la.num_k_heads, la.num_v_heads, la.k_dim, la.v_dim
        self.fused_qkvz, self.fused_ba, self.tiled = la.fused_qkvz, la.fused_ba, la.v_heads_tiled
        d, key, value = cfg.hidden_size, la.num_k_heads * la.k_dim, la.num_v_heads * la.v_dim
        if self.fused_qkvz:  # Qwen3-Next: per key head [q, k, v..., z...]
            self.in_proj_qkvz = nn.Linear(d, 2 * key + 2 * value, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(d, 2 * key + value, bias=False)
            self.in_proj_z = nn.Linear(d, value, bias=False)
        if self.fused_ba:  # Qwen3-Next: per key head [b..., a...]
            self.in_proj_ba = nn.Linear(d, 2 * la.num_v_heads, bias=False)
        else:
            self.in_proj_b = nn.Linear(d, la.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(d, la.num_v_heads, bias=False)
        self.conv1d = gated_delta.Conv(la.conv_dim, la.conv_kernel)
        self.dt_bias = mx.ones((la.num_v_heads,))
        self.A_log = mx.zeros((la.num_v_heads,))
        self.norm = GatedNorm(la.v_dim, la.norm_eps or cfg.rms_norm_eps, la.norm_fp32)
        self.beta_scale = la.beta_scale
        self.out_proj = nn.Linear(value, d, bias=False)

    def _project(self, x: mx.array) -> tuple[mx.array, ...]:
        t, r = x.shape[0], self.nv // self.nk
        if self.fused_qkvz:
            qkvz = self.in_proj_qkvz(x).reshape(t, self.nk, -1)
            q, k, v, z = mx.split(qkvz, [self.dk, 2 * self.dk, 2 * self.dk + r * self.dv], axis=-1)
            mixed = mx.concatenate([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], axis=-1)
        else:
            mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)
        if self.fused_ba:
            b, a = mx.split(self.in_proj_ba(x).reshape(t, self.nk, 2 * r), [r], axis=-1)
        else:
            b, a = self.in_proj_b(x), self.in_proj_a(x)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)

    def _heads(self, mixed: mx.array, b: mx.array, a: mx.array) -> tuple[mx.array, ...]:
        n, key, r = mixed.shape[0], self.nk * self.dk, self.nv // self.nk
        q, k, v = mx.split(mixed, [key, 2 * key], axis=-1)
        q = gated_delta.l2norm(q.astype(mx.float32).reshape(n, self.nk, self.dk)) * self.dk**-0.5
        k = gated_delta.l2norm(k.astype(mx.float32).reshape(n, self.nk, self.dk))
        if r > 1 and self.tiled:  # value head i reads key head i % key heads (llama.cpp's Qwen3.5 order)
            q, k = mx.tile(q, (1, r, 1)), mx.tile(k, (1, r, 1))
        elif r > 1:  # each key head serves r consecutive value heads
            q, k = mx.repeat(q, r, axis=1), mx.repeat(k, r, axis=1)
        g = -mx.exp(self.A_log.astype(mx.float32)) * nn.softplus(a.astype(mx.float32) + self.dt_bias)
        beta = mx.sigmoid(b).astype(mx.float32)
        beta = beta if self.beta_scale == 1.0 else beta * self.beta_scale
        return q, k, v.astype(mx.float32).reshape(n, self.nv, self.dv), g, beta

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: RecurrentState) -> mx.array:
        mixed, z, b, a = self._project(x)
        conv_w, i = self.conv1d.weight, self.state_index
        windows, matrices = state.conv[i], state.ssm[i]
        heads = lambda conv, rows: self._heads(conv, b[rows], a[rows])
        step, chunk = gated_delta.recurrent_step, gated_delta.chunked
        out, state.conv[i], state.ssm[i] = gated_delta.over_batch(
            meta, mixed, conv_w, windows, matrices, heads, step, chunk
        )
        t = x.shape[0]
        return self.out_proj(self.norm(out.astype(x.dtype), z).reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        if kinds[layer_idx]:
            self.linear_attn = GatedDeltaNet(cfg, sum(kinds[:layer_idx]))
        else:
            self.self_attn = GatedAttention(cfg, layer_idx - sum(kinds[:layer_idx]))
        self.mlp = feed_forward(cfg, layer_idx)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: RecurrentState) -> mx.array:
        h = self.input_layernorm(x)
        mixer = self.get("linear_attn")
        h = x + (mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta))
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = RecurrentState
    final_norm = GemmaRMSNorm

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        return state_bytes_per_seq(self.cfg, dtype)
