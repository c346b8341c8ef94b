"""RWKV-7 in MLX over a flattened token batch (maths in app/models/family_rwkv7.py; the torch file has the same
layout): time and channel mixes under LayerNorms, each sequence's token shifts and wkv states in a state slot; no
attention, so the paged pool holds no layer. Parameter names are flash-linear-attention's (its embedding renamed).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import rwkv7
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata

DECAY_SCALE = 0.606531  # e^-0.5: w = exp(-e^-0.5 sigmoid(.)), each channel's decay in (e^-0.607, 1)


class Rwkv7State:
    """Per layer: the time and channel mixes' last inputs [slots, D] and the wkv states [slots, H, Dh, Dh]
    (float32)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        r, d, n = cfg.rwkv7, cfg.hidden_size, cfg.num_layers
        self.att_shift = [mx.zeros((slots, d), dtype=dtype) for _ in range(n)]
        self.ffn_shift = [mx.zeros((slots, d), dtype=dtype) for _ in range(n)]
        self.wkv = [mx.zeros((slots, r.heads, r.head_dim, r.head_dim), dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.att_shift + self.ffn_shift + self.wkv


class LoRA(nn.Module):
    """lora.0 (no bias), an activation, lora.2 (bias unless the gate's): the names of flash-linear-attention's."""

    def __init__(self, width: int, rank: int, act: nn.Module, bias: bool = True):
        super().__init__()
        self.lora = [nn.Linear(width, rank, bias=False), act, nn.Linear(rank, width, bias=bias)]

    def __call__(self, x: mx.array) -> mx.array:
        return self.lora[2](self.lora[1](self.lora[0](x)))


class HeadNorm(nn.Module):
    """g_norm: a LayerNorm over each head's channels, with a weight and bias per head [H, Dh]."""

    def __init__(self, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.weight, self.bias = mx.ones((heads, head_dim)), mx.zeros((heads, head_dim))
        self._eps = eps  # (leading _: not a parameter)

    def __call__(self, y: mx.array) -> mx.array:
        return self.weight * mx.fast.layer_norm(y, None, None, self._eps) + self.bias


class TimeMixing(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        r, d = cfg.rwkv7, cfg.hidden_size
        self.layer_idx = layer_idx
        self._heads = (r.heads, r.head_dim)  # (leading _: not a parameter)
        for mu in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            setattr(self, mu, mx.zeros((d,)))
        self.k_k, self.k_a, self.r_k = (mx.zeros(self._heads) for _ in range(3))
        self.r_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.w_lora = LoRA(d, r.decay_rank, nn.Tanh())
        if layer_idx > 0:
            self.v_lora = LoRA(d, r.v_rank, nn.Identity())
        self.a_lora = LoRA(d, r.a_rank, nn.Identity())
        self.g_lora = LoRA(d, r.gate_rank, nn.Sigmoid(), bias=False)
        self.g_norm = HeadNorm(r.heads, r.head_dim, r.group_norm_eps)

    def __call__(
        self, x: mx.array, meta: AttentionMetadata, state: Rwkv7State, v_first: mx.array | None
    ) -> tuple[mx.array, mx.array]:
        i, t, heads = self.layer_idx, x.shape[0], self._heads
        prev, state.att_shift[i] = rwkv7.token_shift(x, meta, state.att_shift[i])
        xx = prev - x
        xr, xw, xk, xv, xa, xg = (x + xx * mu for mu in (self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        r = self.r_proj(xr).reshape(t, *heads)
        k, v = self.k_proj(xk).reshape(t, *heads), self.v_proj(xv).reshape(t, *heads)
        iclr = mx.sigmoid(self.a_lora(xa)).reshape(t, *heads)
        if v_first is None:  # layer 0: its values are every later layer's v_first
            v_first = v
        else:
            v = v + (v_first - v) * mx.sigmoid(self.v_lora(xv)).reshape(t, *heads)
        w = mx.exp(-DECAY_SCALE * mx.sigmoid(self.w_lora(xw).astype(mx.float32))).reshape(t, *heads)
        kk = k * self.k_k
        kk = kk / mx.maximum(mx.linalg.norm(kk, axis=-1, keepdims=True), 1e-7)
        k = k * (1 + (iclr - 1) * self.k_a)
        y, state.wkv[i] = rwkv7.wkv(meta, state.wkv[i], r, w, k, v, -kk, kk * iclr)
        y = self.g_norm(y.astype(x.dtype))
        y = y + (r * k * self.r_k).sum(-1, keepdims=True) * v
        return self.o_proj(y.reshape(t, -1) * self.g_lora(xg)), v_first


class ChannelMixing(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.x_k = mx.zeros((cfg.hidden_size,))
        self.key = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.value = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: Rwkv7State) -> mx.array:
        prev, state.ffn_shift[self.layer_idx] = rwkv7.token_shift(x, meta, state.ffn_shift[self.layer_idx])
        return self.value(mx.square(nn.relu(self.key(x + (prev - x) * self.x_k))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rwkv7.norm_eps
        self.layer_idx = layer_idx
        if layer_idx == 0:
            self.pre_norm = nn.LayerNorm(d, eps=eps)
        self.attn_norm, self.ffn_norm = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.attn, self.ffn = TimeMixing(cfg, layer_idx), ChannelMixing(cfg, layer_idx)

    def __call__(
        self, x: mx.array, meta: AttentionMetadata, state: Rwkv7State, v_first: mx.array | None
    ) -> tuple[mx.array, mx.array]:
        if self.layer_idx == 0:
            x = self.pre_norm(x)
        h, v_first = self.attn(self.attn_norm(x), meta, state, v_first)
        h = x + h
        return h + self.ffn(self.ffn_norm(h), meta, state), v_first


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
    state_cls = Rwkv7State

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        shift, wkv = self.cfg.rwkv7.state_elements(self.cfg.hidden_size)  # the wkv state in float32
        return self.cfg.num_layers * (shift * dtype.size + wkv * 4)

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        h, v_first = self.model.embed_tokens(input_ids), None
        for layer in self.model.layers:
            h, v_first = layer(h, meta, self.recurrent, v_first)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])
