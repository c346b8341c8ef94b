"""LFM2 / LFM3 decoder in torch over a flattened token batch (maths in app/models/family_lfm2.py and
family_lfm3.py; the same layout as the MLX file): gated short-convolution layers keeping the convolution's last
inputs per sequence (a state slot, as Qwen3-Next's layers: models/qwen3_next.py says how slots work), and Llama's
attention with per-head q/k norms over the paged pool, which holds the attention layers only. LFM3's sliding layers
rotate with a plain rope of their own base (CausalLM's local rope), its full layers with the model's (the runner's
table: proportional where the config says); its sandwich norms follow the operator and the MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.family_lfm3 import attention_config
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.models.gemma import LocalRope, Rope
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
            pool_idx = layer_idx - sum(kinds[:layer_idx])
            self.self_attn = Attention(attention_config(cfg), pool_idx, tp, o_bias=cfg.attention_bias)
        # LFM3's sliding layers rotate with a plain rope of their own base (CausalLM.local_rope)
        window = self.self_attn.window if hasattr(self, "self_attn") else None
        self.local_rope = window is not None and cfg.local_rope_theta is not None
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)  # LFM2-MoE: layers past the dense ones
        self.mlp = DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)  # (operator_norm)
        self.post_attention_layernorm = RMSNorm(d, eps)  # (ffn_norm)
        self.sandwich = cfg.sandwich_norms  # LFM3: norms of the operator's and the MLP's outputs
        if self.sandwich:
            self.post_operator_norm = RMSNorm(d, eps)
            self.post_ffn_norm = RMSNorm(d, eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        state: ConvState,
        local_rope: Rope | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "conv", None)
        if mixer is not None:
            h = mixer(h, meta, state)
        else:
            h = self.self_attn(h, meta, local_rope if self.local_rope else None)
        if self.sandwich:
            h = self.post_operator_norm(h)[0]
        h, residual = self.post_attention_layernorm(h, residual)
        out = self.mlp(h)
        return (self.post_ffn_norm(out)[0] if self.sandwich else out), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = ConvState

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        # LFM3's sliding layers: a plain rope of their base over the whole head; None for LFM2
        self._local_rope = LocalRope(cfg, cfg.local_rope_dim or cfg.head_dim)

    def layer_extras(self, meta: TorchAttentionMetadata) -> tuple:
        return (self.state, self._local_rope(meta))

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        sc = self.cfg.short_conv
        return sum(sc.conv_layers) * self.cfg.hidden_size * (sc.kernel - 1) * dtype.itemsize
