"""Falcon-H1 decoder in MLX over a flattened token batch (maths in app/models/family_falcon_h1.py; the torch file
has the same layout): every layer runs Granite 4.0-H's Mamba-2 mixer (models/granite_hybrid.py: its state
slots, in_proj's μP multipliers, the gated norm's variants) and Llama's attention over the paged pool side by
side on one normed input, then a SwiGLU MLP whose gate and output carry multipliers too.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import granite_hybrid
from lantern.backends.mlx.paged_attention import AttentionMetadata


class FalconMLP(MLP):
    """down(silu(gate(x) * mlp_gate) * up(x)) * mlp_down."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.gate_multiplier, self.down_multiplier = cfg.falcon_h1.mlp_gate, cfg.falcon_h1.mlp_down

    def __call__(self, x: mx.array) -> mx.array:
        gate = self.gate_proj(x)
        if self.gate_multiplier != 1.0:
            gate = gate * self.gate_multiplier
        out = self.down_proj(self.act(gate) * self.up_proj(x))
        return out if self.down_multiplier == 1.0 else out * self.down_multiplier


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.mamba = granite_hybrid.Mamba2Mixer(cfg, layer_idx)  # every layer keeps a state and K/V
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = FalconMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.scalars = cfg.falcon_h1

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: granite_hybrid.MambaState) -> mx.array:
        h, s = self.input_layernorm(x), self.scalars
        mixed = self.mamba(h, meta, state)
        attn = self.self_attn(h if s.attention_in == 1.0 else h * s.attention_in, meta)
        x = x + mixed * s.ssm_out + attn * s.attention_out
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(granite_hybrid.CausalLM):
    """Granite 4.0-H's shell: the same Mamba state (one per layer here), sized by the same Mamba2Config."""

    decoder_layer = DecoderLayer
