"""Granite 4.0-H decoder in MLX over a flattened token batch (maths in app/models/family_mamba2.py and
family_granite.py; the torch file has the same layout): Mamba-2 mixer layers with a per-sequence state
among Granite's attention layers over the paged pool (attention layers only); every layer's MLP is the
dense shared_mlp, plus GraniteMoE's routed experts beside it when the model has them.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import gated_delta, mamba2
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class MambaState:
    """Per Mamba layer: convolution windows [slots, conv_dim, K-1] and SSM states [slots, H, P, N] (float32)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        m = cfg.mamba
        n = sum(m.mamba_layers)
        self.conv = [mx.zeros((slots, m.conv_dim, m.conv_kernel - 1), dtype=dtype) for _ in range(n)]
        self.ssm = [mx.zeros((slots, m.num_heads, m.head_dim, m.state_size), dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.conv + self.ssm


class GroupedGatedNorm(nn.Module):
    """RMSNorm of y * SiLU(z) over each of `groups` channel groups, times the weight (float32 inside); with
    before_gate (Falcon-H1's mamba_norm_before_gate) RMSNorm(y) * SiLU(z)."""

    def __init__(self, dim: int, groups: int, eps: float, before_gate: bool = False):
        super().__init__()
        self.weight = mx.ones((dim,))
        self.groups, self.eps, self.before_gate = groups, eps, before_gate

    def __call__(self, y: mx.array, z: mx.array, dtype: mx.Dtype) -> mx.array:
        gate, y = nn.silu(z.astype(mx.float32)), y.astype(mx.float32)
        h = (y if self.before_gate else y * gate).reshape(y.shape[0], self.groups, -1)
        h = h * mx.rsqrt((h * h).mean(-1, keepdims=True) + self.eps)
        h = self.weight.astype(mx.float32) * h.reshape(y.shape[0], -1)
        return (h * gate if self.before_gate else h).astype(dtype)


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        m = cfg.mamba
        self.m, self.state_index = m, state_index  # its place among the Mamba layers' states
        self.in_proj = nn.Linear(cfg.hidden_size, m.inner + m.conv_dim + m.num_heads, bias=m.proj_bias)
        self.conv1d = gated_delta.Conv(m.conv_dim, m.conv_kernel)
        if m.conv_bias:
            self.conv1d.bias = mx.zeros((m.conv_dim,))
        self.dt_bias = mx.ones((m.num_heads,))
        self.A_log = mx.zeros((m.num_heads,))
        self.D = mx.ones((m.num_heads,))
        if m.norm != "none":  # (Falcon-H1 without mamba_rms_norm: y * SiLU(z), no weight)
            self.norm = GroupedGatedNorm(m.inner, m.groups, m.norm_eps, before_gate=m.norm == "before_gate")
        self.out_proj = nn.Linear(m.inner, cfg.hidden_size, bias=m.proj_bias)
        scale = [1.0] * (m.inner + m.conv_dim + m.num_heads)  # Falcon-H1's μP multipliers of in_proj's parts
        for start, end, value in m.in_spans():
            scale[start:end] = [value] * (end - start)
        self._in_scale = mx.array(scale) if m.in_spans() else None  # (a leading _: not a parameter)

    def _ssm_inputs(self, xbc: mx.array, dt: mx.array) -> tuple[mx.array, ...]:
        """Convolved xBC [L, conv_dim] and raw dt [L, H] -> x [L, H, P], dt (softplus'd, clamped), B, C [L, G, N]."""
        m, n = self.m, xbc.shape[0]
        x, b, c = mx.split(xbc, [m.inner, m.inner + m.groups * m.state_size], axis=-1)
        dt = mx.clip(nn.softplus(dt.astype(mx.float32) + self.dt_bias.astype(mx.float32)), *m.dt_limit)
        shape = (n, m.groups, m.state_size)
        return x.reshape(n, m.num_heads, m.head_dim), dt, b.reshape(shape), c.reshape(shape)

    def __call__(self, h: mx.array, meta: AttentionMetadata, state: MambaState) -> mx.array:
        m, t, i = self.m, h.shape[0], self.state_index
        projected = self.in_proj(h)
        if self._in_scale is not None:
            projected = projected * self._in_scale.astype(projected.dtype)
        z, xbc, dt = mx.split(projected, [m.inner, m.inner + m.conv_dim], axis=-1)
        w, bias = self.conv1d.weight, self.conv1d.get("bias")
        windows, ssm = state.conv[i], state.ssm[i]
        a, d = -mx.exp(self.A_log.astype(mx.float32)), self.D.astype(mx.float32)
        pieces = []
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            fresh = meta.decode_state_fresh  # a one-token prompt starts from zeros (where, not a product: 0 * NaN)
            window = mx.where(fresh[:, None, None], 0, windows[slots])
            conv, windows[slots] = gated_delta.conv_step(xbc[rows], window, w, bias)
            x, step_dt, b, c = self._ssm_inputs(conv, dt[rows])
            s = mx.where(fresh[:, None, None, None], 0, ssm[slots])
            out, ssm[slots] = mamba2.step(x, step_dt, a, b, c, d, s)
            pieces.append(out)
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.first_pos == 0
            window = mx.zeros_like(windows[slot]) if first else windows[slot]
            conv, windows[slot] = gated_delta.conv_chunk(xbc[span], window, w, bias)
            x, chunk_dt, b, c = self._ssm_inputs(conv, dt[span])
            s = mx.zeros_like(ssm[slot]) if first else ssm[slot]
            out, ssm[slot] = mamba2.chunked(x, chunk_dt, a, b, c, d, s)
            pieces.append(out)
        state.conv[i], state.ssm[i] = windows, ssm
        y = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
        if meta.restore_order is not None:  # pieces are decode rows first, then each prefill
            y = y[meta.restore_order]
        y, norm = y.reshape(t, -1), self.get("norm")
        if norm is None:
            return self.out_proj((y.astype(mx.float32) * nn.silu(z.astype(mx.float32))).astype(h.dtype))
        return self.out_proj(norm(y, z, h.dtype))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.mamba.mamba_layers if cfg.mamba is not None else (False,) * cfg.num_layers  # (granite-4.0-micro)
        if kinds[layer_idx]:
            self.mamba = Mamba2Mixer(cfg, sum(kinds[:layer_idx]))
        else:  # layer_idx: its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, layer_idx - sum(kinds[:layer_idx]))
        self.shared_mlp = MLP(cfg)  # dense, in every layer
        if cfg.moe is not None:  # GraniteMoE's routed experts beside it (softmax over the top-k logits)
            from lantern.backends.mlx.moe import SparseMoE

            self.mlp = SparseMoE(cfg, softmax_after_topk=True)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.residual_multiplier = cfg.residual_multiplier

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: MambaState) -> mx.array:
        h = self.input_layernorm(x)
        mixer = self.get("mamba")
        h = x + (mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)) * self.residual_multiplier
        normed = self.post_attention_layernorm(h)
        out = self.shared_mlp(normed)
        routed = self.get("mlp")
        return h + (out if routed is None else routed(normed) + out) * self.residual_multiplier


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        conv, ssm = self.cfg.mamba.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba.mamba_layers) * (conv * dtype.size + ssm * 4)
