"""RecurrentGemma (Griffin) in MLX over a flattened token batch (maths in app/models/family_recurrent_gemma.py; the
torch file has the same layout): Gemma's residual blocks whose temporal block is local attention over the paged
pool (attention layers only) or an RG-LRU recurrent block keeping a state per sequence (a state slot).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import gated_delta
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import gemma, llama
from lantern.backends.mlx.paged_attention import AttentionMetadata

CHUNK = 64  # tokens per block of the prefill scan (a [CHUNK, CHUNK, width] decay table each)
TINY = 1.1754944e-38  # float32's smallest normal: the decay's floor (a log of 0 would be -inf)


class LRUState:
    """Per recurrent layer: convolution windows [slots, width, K-1] and recurrences [slots, width] (float32)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        r = cfg.rglru
        n = sum(r.recurrent_layers)
        self.conv = [mx.zeros((slots, r.width, r.conv_kernel - 1), dtype=dtype) for _ in range(n)]
        self.ssm = [mx.zeros((slots, r.width), dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.conv + self.ssm


def lru_scan(log_a: mx.array, x: mx.array, h: mx.array) -> tuple[mx.array, mx.array]:
    """h_t = a_t h_{t-1} + x_t over one sequence's tokens: log_a, x [L, W] float32, h [W] -> (every h_t, the last).
    Blocks of CHUNK tokens take exp of within-block sums of log a (each at most 0: no overflow)."""
    blocks = []
    for start in range(0, x.shape[0], CHUNK):
        la, xs = log_a[start : start + CHUNK], x[start : start + CHUNK]
        cum = mx.cumsum(la, axis=0)
        n = cum.shape[0]
        causal = mx.tril(mx.ones((n, n), dtype=mx.bool_))[..., None]
        decay = mx.exp(mx.where(causal, cum[:, None, :] - cum[None, :, :], -mx.inf))
        block = (decay * xs[None]).sum(1) + mx.exp(cum) * h
        blocks.append(block)
        h = block[-1]
    return (blocks[0] if len(blocks) == 1 else mx.concatenate(blocks)), h


class RGLRU(nn.Module):
    """The gates (block-diagonal: one [width / heads]^2 matrix per head, stored [in, out]) and the decay's
    parameter; gates() gives each token's log a and its normalised input."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        r = cfg.rglru
        block = r.width // r.heads
        self._heads = r.heads
        self.recurrent_param = mx.zeros((r.width,))
        self.input_gate_weight = mx.zeros((r.heads, block, block))
        self.input_gate_bias = mx.zeros((r.heads, block))
        self.recurrent_gate_weight = mx.zeros((r.heads, block, block))
        self.recurrent_gate_bias = mx.zeros((r.heads, block))

    def gates(self, u: mx.array, first: mx.array) -> tuple[mx.array, mx.array]:
        """u [T, W] (the convolution's output), first [T] (a sequence's first token) -> float32 log a and
        sqrt(1 - a^2) * u * input gate (u * input gate at a first token), both [T, W]."""
        t = u.shape[0]
        blocks = u.reshape(t, self._heads, -1).transpose(1, 0, 2)  # [H, T, block]
        gate_x = mx.sigmoid((blocks @ self.input_gate_weight).transpose(1, 0, 2) + self.input_gate_bias)
        gate_a = mx.sigmoid((blocks @ self.recurrent_gate_weight).transpose(1, 0, 2) + self.recurrent_gate_bias)
        # log a, a and the input's multiplier in the model dtype, as transformers computes them (in bfloat16 a slow
        # channel's a rounds to 1 and its multiplier to 0); the scan then runs on that a in float32
        log_a = -8.0 * gate_a.reshape(t, -1) * nn.softplus(self.recurrent_param)
        multiplier = mx.where(first[:, None], 1.0, mx.sqrt(1 - mx.exp(2 * log_a)))
        normed = u * gate_x.reshape(t, -1) * multiplier.astype(u.dtype)
        a = mx.maximum(mx.exp(log_a).astype(mx.float32), TINY)
        return mx.log(a), normed.astype(mx.float32)


class RecurrentBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        r, d = cfg.rglru, cfg.hidden_size
        self._state_index = state_index  # its place among the recurrent layers' states
        self.linear_y = nn.Linear(d, r.width)
        self.linear_x = nn.Linear(d, r.width)
        self.linear_out = nn.Linear(r.width, d)
        self.conv_1d = gated_delta.Conv(r.width, r.conv_kernel)
        self.conv_1d.bias = mx.zeros((r.width,))
        self.rg_lru = RGLRU(cfg)

    def __call__(self, h: mx.array, meta: AttentionMetadata, state: LRUState) -> mx.array:
        i = self._state_index
        y = nn.gelu_approx(self.linear_y(h))
        u = self.linear_x(h)
        w, bias = self.conv_1d.weight, self.conv_1d.bias
        windows, recurrences = state.conv[i], state.ssm[i]
        pieces, positions, spans = [], [], []  # decode rows first, then each prefill
        rows = meta.decode_token_idx
        if rows is not None:
            slots, fresh = meta.decode_state_slots, meta.decode_state_fresh  # (where, not a product: 0 * NaN)
            window = mx.where(fresh[:, None, None], 0, windows[slots])
            conv, windows[slots] = gated_delta.conv_step(u[rows], window, w, bias, silu=False)
            pieces.append(conv)
            positions.append(meta.positions[rows])
        for p in meta.prefills:
            first = p.first_pos == 0
            window = mx.zeros_like(windows[p.state_slot]) if first else windows[p.state_slot]
            conv, windows[p.state_slot] = gated_delta.conv_chunk(u[p.q_start : p.q_end], window, w, bias, silu=False)
            pieces.append(conv)
            positions.append(meta.positions[p.q_start : p.q_end])
            spans.append(first)
        conv = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
        log_a, x = self.rg_lru.gates(conv, mx.concatenate(positions) == 0)
        outs, at = [], 0
        if rows is not None:
            n = rows.shape[0]
            prev = mx.where(fresh[:, None], 0, recurrences[slots])
            step = mx.exp(log_a[:n]) * prev + x[:n]
            recurrences[slots] = step
            outs.append(step)
            at = n
        for p, first in zip(meta.prefills, spans):
            n = p.q_end - p.q_start
            start = mx.zeros_like(recurrences[p.state_slot]) if first else recurrences[p.state_slot]
            out, recurrences[p.state_slot] = lru_scan(log_a[at : at + n], x[at : at + n], start)
            outs.append(out)
            at += n
        state.conv[i], state.ssm[i] = windows, recurrences
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        if meta.restore_order is not None:
            out = out[meta.restore_order]
        return self.linear_out(out.astype(h.dtype) * y)


class DecoderLayer(nn.Module):
    """Gemma's residual block: temporal_pre_norm, the temporal block, channel_pre_norm, the biased GeGLU MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.rglru.recurrent_layers
        before = sum(kinds[:layer_idx])
        if kinds[layer_idx]:
            self.temporal_block = RecurrentBlock(cfg, before)
        else:  # its K/V's place in the pool (attention layers only)
            self.temporal_block = Attention(cfg, layer_idx - before, o_bias=True)
        self._recurrent = kinds[layer_idx]
        self.mlp_block = MLP(cfg, bias=True)
        self.temporal_pre_norm = gemma.GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.channel_pre_norm = gemma.GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: LRUState) -> mx.array:
        h = self.temporal_pre_norm(x)
        h = self.temporal_block(h, meta, state) if self._recurrent else self.temporal_block(h, meta)
        h = x + h
        return h + self.mlp_block(self.channel_pre_norm(h))


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = gemma.GemmaRMSNorm
    state_cls = LRUState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        conv, recurrence = self.cfg.rglru.state_elements()  # the recurrence in float32
        return sum(self.cfg.rglru.recurrent_layers) * (conv * dtype.size + recurrence * 4)
