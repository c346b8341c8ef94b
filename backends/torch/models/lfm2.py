"""LFM2 decoder in torch over a flattened token batch (maths in app/models/family_lfm2.py; the same
layout as the MLX file): gated short-convolution layers keeping the convolution's last inputs per
sequence (a state slot, as Qwen3-Next's layers: models/qwen3_next.py says how slots work), and Llama's
attention with per-head q/k norms over the paged pool, which holds the attention layers only.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.parallel import TPGroup


class ConvState:
    """Per short-conv layer: the convolution's last K-1 inputs [slots, hidden, K-1] (committed as written)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        sc, d = cfg.short_conv, cfg.hidden_size
        self.conv = [lazy_zeros((slots, d, sc.kernel - 1), dtype, device) for _ in range(sum(sc.conv_layers))]


class ShortConv(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        d, sc = cfg.hidden_size, cfg.short_conv
        self.state_index = state_index
        self.in_proj = nn.Linear(d, 3 * d, bias=sc.bias)
        self.conv = gated_delta.Conv(d, sc.kernel)
        if sc.bias:
            self.conv.bias = nn.Parameter(torch.empty(d), requires_grad=False)
        self.out_proj = nn.Linear(d, d, bias=sc.bias)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, state: ConvState) -> torch.Tensor:
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        h = b * h
        w, bias, windows = self.conv.weight, getattr(self.conv, "bias", None), state.conv[self.state_index]
        out = torch.empty_like(h)
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            window = windows[slots].masked_fill(meta.decode_state_fresh[:, None, None], 0)  # a one-token prompt
            out[rows], windows[slots] = gated_delta.conv_step(h[rows], window, w, bias, silu=False)
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.ctx_len == p.q_end - p.q_start
            window = torch.zeros_like(windows[slot]) if first else windows[slot]
            out[span], windows[slot] = gated_delta.conv_chunk(h[span], window, w, bias, silu=False)
        return self.out_proj(c * out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.short_conv.conv_layers if cfg.short_conv is not None else (False,) * cfg.num_layers
        if kinds[layer_idx]:
            self.conv = ShortConv(cfg, sum(kinds[:layer_idx]))
        else:  # layer_idx: its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, layer_idx - sum(kinds[:layer_idx]), tp)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)  # LFM2-MoE: layers past the dense ones
        self.mlp = DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: ConvState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "conv", None)
        h = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = ConvState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        sc = self.cfg.short_conv
        return sum(sc.conv_layers) * self.cfg.hidden_size * (sc.kernel - 1) * dtype.itemsize
