"""LFM2 / LFM3 decoder in MLX over a flattened token batch (maths in app/models/family_lfm2.py and
family_lfm3.py; the torch file has the same layout): gated short-convolution layers with a per-sequence
convolution state, and Llama's attention with per-head q/k norms over the paged pool (attention layers only).
LFM3's sliding layers rotate with a plain rope of their own base (layers.Attention's local rope), its full layers
with the model's, proportional over the whole head where the config says; its sandwich norms follow the operator
and the MLP.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.family_lfm3 import attention_config, full_inv_freq
from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx import gated_delta
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE
from lantern.backends.mlx.paged_attention import AttentionMetadata
from lantern.backends.mlx.rope import FreqRoPE


class ConvState:
    """Per short-conv layer: the convolution's last K-1 inputs [slots, hidden, K-1]."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        sc = cfg.short_conv
        self.conv = [mx.zeros((slots, cfg.hidden_size, sc.kernel - 1), dtype=dtype) for _ in range(sum(sc.conv_layers))]

    def arrays(self) -> list[mx.array]:
        return self.conv


class ShortConv(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        d, sc = cfg.hidden_size, cfg.short_conv
        self.state_index = state_index
        self.in_proj = nn.Linear(d, 3 * d, bias=sc.bias)
        self.conv = gated_delta.Conv(d, sc.kernel)
        if sc.bias:
            self.conv.bias = mx.zeros((d,))
        self.out_proj = nn.Linear(d, d, bias=sc.bias)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: ConvState) -> mx.array:
        b, c, h = mx.split(self.in_proj(x), 3, axis=-1)
        h = b * h
        w, bias, windows = self.conv.weight, self.conv.get("bias"), state.conv[self.state_index]
        pieces = []
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            fresh = meta.decode_state_fresh  # a one-token prompt starts from zeros (where, not a product: 0 * NaN)
            window = mx.where(fresh[:, None, None], 0, windows[slots])
            out, windows[slots] = gated_delta.conv_step(h[rows], window, w, bias, silu=False)
            pieces.append(out)
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            window = mx.zeros_like(windows[slot]) if p.first_pos == 0 else windows[slot]
            out, windows[slot] = gated_delta.conv_chunk(h[span], window, w, bias, silu=False)
            pieces.append(out)
        state.conv[self.state_index] = windows
        out = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
        if meta.restore_order is not None:  # pieces are decode rows first, then each prefill
            out = out[meta.restore_order]
        return self.out_proj(c * out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.short_conv.conv_layers if cfg.short_conv is not None else (False,) * cfg.num_layers
        if kinds[layer_idx]:
            self.conv = ShortConv(cfg, sum(kinds[:layer_idx]))
        else:  # layer_idx: its K/V's place in the pool (attention layers only)
            pool_idx = layer_idx - sum(kinds[:layer_idx])
            self.self_attn = Attention(attention_config(cfg), pool_idx, o_bias=cfg.attention_bias)
            inv_freq = full_inv_freq(cfg)
            if inv_freq is not None and self.self_attn.window is None:  # LFM3's full layers: the proportional rope
                self.self_attn.rope = FreqRoPE(cfg.head_dim, inv_freq, False)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)  # LFM2-MoE: layers past the dense ones
        self.mlp = DeepSeekMoE(cfg) if sparse else MLP(cfg)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)  # (operator_norm)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)  # (ffn_norm)
        self.sandwich = cfg.sandwich_norms  # LFM3: norms of the operator's and the MLP's outputs
        if self.sandwich:
            self.post_operator_norm = nn.RMSNorm(d, eps=eps)
            self.post_ffn_norm = nn.RMSNorm(d, eps=eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: ConvState) -> mx.array:
        h = self.input_layernorm(x)
        mixer = self.get("conv")
        out = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)
        h = x + (self.post_operator_norm(out) if self.sandwich else out)
        out = self.mlp(self.post_attention_layernorm(h))
        return h + (self.post_ffn_norm(out) if self.sandwich else out)


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = ConvState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        sc = self.cfg.short_conv
        return sum(sc.conv_layers) * self.cfg.hidden_size * (sc.kernel - 1) * dtype.size
