"""Falcon-H1 decoder in torch over a flattened token batch (maths in app/models/family_falcon_h1.py; the same
layout as the MLX file): every layer runs Granite 4.0-H's Mamba-2 mixer (models/granite_hybrid.py: its state
slots, in_proj's μP multipliers, the gated norm's variants) and Llama's attention over the paged pool side by
side on one normed input, then a SwiGLU MLP whose gate and output carry multipliers too.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import granite_hybrid
from lantern.backends.torch.parallel import TPGroup


class FalconMLP(MLP):
    """down(silu(gate(x) * mlp_gate) * up(x)) * mlp_down."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__(cfg, tp)
        self.gate_multiplier, self.down_multiplier = cfg.falcon_h1.mlp_gate, cfg.falcon_h1.mlp_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.gate_multiplier != 1.0:
            gate = gate * self.gate_multiplier
        out = self.tp.all_reduce(self.down_proj(self.act(gate).mul_(up)))
        return out if self.down_multiplier == 1.0 else out * self.down_multiplier


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.mamba = granite_hybrid.Mamba2Mixer(cfg, layer_idx)  # every layer keeps a state and K/V
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.mlp = FalconMLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.scalars = cfg.falcon_h1

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        state: granite_hybrid.MambaState,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        s = self.scalars
        mixed = self.mamba(h, meta, state)
        attn = self.self_attn(h if s.attention_in == 1.0 else h * s.attention_in, meta)
        h, residual = self.post_attention_layernorm(mixed * s.ssm_out + attn * s.attention_out, residual)
        return self.mlp(h), residual


class CausalLM(granite_hybrid.CausalLM):
    """Granite 4.0-H's shell: the same Mamba state (one per layer here), sized by the same Mamba2Config."""

    decoder_layer = DecoderLayer
