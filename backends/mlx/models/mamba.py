"""Mamba / Falcon-Mamba decoder in MLX over a flattened token batch (maths in app/models/family_mamba.py; the torch
file has the same layout): Mamba-1 mixers keeping a state per sequence, each under an RMSNorm; no attention, so the
paged pool holds no layer.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import gated_delta, mamba1
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class MambaState:
    """Per Mamba layer: convolution windows [slots, d_inner, K-1] and SSM states [slots, d_inner, N] (float32)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        m = cfg.mamba1
        n = sum(m.mamba_layers)
        self.conv = [mx.zeros((slots, m.inner, m.conv_kernel - 1), dtype=dtype) for _ in range(n)]
        self.ssm = [mx.zeros((slots, m.inner, m.state_size), dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.conv + self.ssm


def _rms(x: mx.array, eps: float, weight: mx.array | None) -> mx.array:
    xf = x.astype(mx.float32)
    xf = xf * mx.rsqrt((xf * xf).mean(-1, keepdims=True) + eps)
    return (xf if weight is None else weight.astype(mx.float32) * xf).astype(x.dtype)


class Mamba1Mixer(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        m = cfg.mamba1
        self.m, self.state_index = m, state_index  # its place among the Mamba layers' states
        self.in_proj = nn.Linear(cfg.hidden_size, 2 * m.inner, bias=m.proj_bias)
        self.conv1d = gated_delta.Conv(m.inner, m.conv_kernel)
        if m.conv_bias:
            self.conv1d.bias = mx.zeros((m.inner,))
        if m.heads == 1:
            self.x_proj = nn.Linear(m.inner, m.dt_rank + 2 * m.state_size, bias=False)
            self.dt_proj = nn.Linear(m.dt_rank, m.inner, bias=True)
        else:  # Zamba: each head's x_proj and dt_proj (its checkpoint's names and shapes)
            p = m.inner // m.heads
            self.x_proj_weight = mx.zeros((m.heads, m.dt_rank + 2 * m.state_size, p))
            self.dt_proj_weight = mx.zeros((m.heads, p, m.dt_rank))
            self.dt_proj_bias = mx.zeros((m.heads, p))
        self.A_log = mx.zeros((m.inner, m.state_size))
        self.D = mx.ones((m.inner,))
        self.out_proj = nn.Linear(m.inner, cfg.hidden_size, bias=m.proj_bias)
        if m.bc_norm == "weighted":  # Jamba's RMSNorms of dt, B and C, with weights
            self.dt_layernorm = nn.RMSNorm(m.dt_rank, eps=m.norm_eps)
            self.b_layernorm = nn.RMSNorm(m.state_size, eps=m.norm_eps)
            self.c_layernorm = nn.RMSNorm(m.state_size, eps=m.norm_eps)

    def _ssm_inputs(self, conv: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Convolved x [L, d_inner] -> dt [L, d_inner] (softplus'd, float32), B, C [L, N] (heads: [L, heads, N])."""
        m = self.m
        if m.heads > 1:
            return self._head_ssm_inputs(conv)
        dt, b, c = mx.split(self.x_proj(conv), [m.dt_rank, m.dt_rank + m.state_size], axis=-1)
        if m.bc_norm != "none":
            weighted = m.bc_norm == "weighted"
            dt = _rms(dt, m.norm_eps, self.dt_layernorm.weight if weighted else None)
            b = _rms(b, m.norm_eps, self.b_layernorm.weight if weighted else None)
            c = _rms(c, m.norm_eps, self.c_layernorm.weight if weighted else None)
        return nn.softplus(self.dt_proj(dt).astype(mx.float32)), b, c

    def _head_ssm_inputs(self, conv: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Zamba's heads (see the torch file)."""
        m, rows = self.m, conv.shape[0]
        x = conv.reshape(rows, m.heads, -1)
        params = mx.einsum("lhp,hkp->lhk", x, self.x_proj_weight)
        dt, b, c = mx.split(params, [m.dt_rank, m.dt_rank + m.state_size], axis=-1)
        dt = mx.einsum("lhr,hpr->lhp", dt, self.dt_proj_weight) + self.dt_proj_bias
        return nn.softplus(dt.reshape(rows, m.inner).astype(mx.float32)), b, c  # (per head: the scans repeat them)

    def __call__(self, h: mx.array, meta: AttentionMetadata, state: MambaState) -> mx.array:
        i = self.state_index
        x, z = mx.split(self.in_proj(h), 2, axis=-1)
        w, bias = self.conv1d.weight, self.conv1d.get("bias")
        windows, ssm = state.conv[i], state.ssm[i]
        a, d = -mx.exp(self.A_log.astype(mx.float32)), self.D.astype(mx.float32)
        pieces = []
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            fresh = meta.decode_state_fresh  # a one-token prompt starts from zeros (where, not a product: 0 * NaN)
            window = mx.where(fresh[:, None, None], 0, windows[slots])
            conv, windows[slots] = gated_delta.conv_step(x[rows], window, w, bias)
            dt, b, c = self._ssm_inputs(conv)
            out, ssm[slots] = mamba1.step(conv, dt, a, b, c, d, mx.where(fresh[:, None, None], 0, ssm[slots]))
            pieces.append(out)
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.first_pos == 0
            window = mx.zeros_like(windows[slot]) if first else windows[slot]
            conv, windows[slot] = gated_delta.conv_chunk(x[span], window, w, bias)
            dt, b, c = self._ssm_inputs(conv)
            s = mx.zeros_like(ssm[slot]) if first else ssm[slot]
            out, ssm[slot] = mamba1.chunked(conv, dt, a, b, c, d, s)
            pieces.append(out)
        state.conv[i], state.ssm[i] = windows, ssm
        y = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
        if meta.restore_order is not None:  # pieces are decode rows first, then each prefill
            y = y[meta.restore_order]
        return self.out_proj((y * nn.silu(z.astype(mx.float32))).astype(h.dtype))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.mamba = Mamba1Mixer(cfg, layer_idx)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: MambaState) -> mx.array:
        return x + self.mamba(self.input_layernorm(x), meta, state)


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        conv, ssm = self.cfg.mamba1.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba1.mamba_layers) * (conv * dtype.size + ssm * 4)
