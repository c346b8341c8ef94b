"""Dory for MLX over a flattened token batch (maths in app/models/family_dory.py; the torch file has the same layout):
nGPT's unit-sphere layers without norm weights, the recurrent section run n_recurrent_loops times, each pass of a
layer reading and writing its own layer of the KV pool; the sliding layers' rope of their own base.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention
from lantern.backends.mlx.rope import build_rope


def l2(x: mx.array) -> mx.array:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, in float32 (DoryL2Norm)."""
    xf = x.astype(mx.float32)
    return (xf * mx.rsqrt((xf * xf).sum(-1, keepdims=True) + 1e-6)).astype(x.dtype)


class UnitNorm(nn.Module):
    """The final norm's slot in the Backbone: an L2 norm, no weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()

    def __call__(self, x: mx.array) -> mx.array:
        return l2(x)


class DoryAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        h, kv, hd, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        self.h, self.kv, self.hd, self.loops = h, kv, hd, cfg.dory
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.gate_proj = nn.Linear(d, h * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.sqk = mx.zeros((h * hd,))
        self.s_gate = mx.zeros((h * hd,))
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None
        local = self.window is not None and cfg.local_rope_theta is not None
        theta = cfg.local_rope_theta if local else cfg.rope_theta
        self.rope = build_rope(hd, theta, False, None if local else cfg.rope_scaling, cfg.max_position_embeddings)

    def _rotate(self, x: mx.array, positions: mx.array) -> mx.array:
        return self.rope(x[:, :, None, :], offset=positions)[:, :, 0, :]

    def __call__(self, x: mx.array, meta: AttentionMetadata, kv_layer: int) -> mx.array:
        t, hd = x.shape[0], self.hd
        q = self._rotate(l2(self.q_proj(x).reshape(t, self.h, hd)), meta.positions)
        k = self._rotate(l2(self.k_proj(x).reshape(t, self.kv, hd)), meta.positions)
        q = q * mx.square(self.sqk * self.loops.sqk_scale).reshape(self.h, hd)
        v = self.v_proj(x).reshape(t, self.kv, hd)
        out = paged_attention(q, k, v, meta, kv_layer, hd**-0.5, window=self.window)
        gate = mx.sigmoid(self.gate_proj(x) * mx.square(self.s_gate * self.loops.s_gate_scale))
        return self.o_proj(l2(out.reshape(t, -1) * gate))


class DoryMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inner = cfg.intermediate_size
        self.gate_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.down_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.suv_gate = mx.zeros((inner,))
        self.suv_up = mx.zeros((inner,))
        self.scale = cfg.dory.suv_scale

    def __call__(self, x: mx.array) -> mx.array:
        gate = self.gate_proj(x) * (self.suv_gate * self.scale)
        up = self.up_proj(x) * (self.suv_up * self.scale)
        return self.down_proj(l2(nn.silu(gate) * up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DoryAttention(cfg, layer_idx)
        self.mlp = DoryMLP(cfg)
        self.lambda_1 = mx.zeros((cfg.hidden_size,))
        self.lambda_2 = mx.zeros((cfg.hidden_size,))
        self.scale = cfg.dory.lambda_scale

    def __call__(self, x: mx.array, meta: AttentionMetadata, kv_layer: int) -> mx.array:
        h = l2(x)
        a = l2(self.self_attn(h, meta, kv_layer))
        h = l2(h + mx.abs(self.lambda_1 * self.scale) * (a - h))
        m = l2(self.mlp(h))
        return h + mx.abs(self.lambda_2 * self.scale) * (m - h)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = UnitNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.model.logit_scale = mx.zeros((cfg.vocab_size,))

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        loops, layers = self.cfg.dory, self.model.layers
        h = self.model.embed_tokens(input_ids)
        for i in range(loops.n_input):
            h = layers[i](h, meta, i)
        start = l2(h)  # each pass restarts from the input section's output
        for loop in range(loops.loops):
            h = l2(h) + start
            for j in range(loops.n_recurrent):
                h = layers[loops.n_input + j](h, meta, loops.recurrent_kv(loop, j))
        for k in range(loops.n_output):
            h = layers[loops.n_input + loops.n_recurrent + k](h, meta, loops.output_kv(k))
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return l2(h[rows])

    def __call__(self, input_ids: mx.array, meta: AttentionMetadata, logits_idx: mx.array) -> mx.array:
        logits = super().__call__(input_ids, meta, logits_idx).astype(mx.float32)
        return logits * (self.model.logit_scale.astype(mx.float32) * self.cfg.dory.logit_factor)
