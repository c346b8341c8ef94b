"""Phi-1 / 1.5 / 2, GPT-NeoX and Falcon decoder for MLX over a flattened token batch (maths in
app/models/family_phi.py and family_gptneox.py; the torch file has the same layout): one LayerNorm with a bias
feeding attention (biases where the config says, a partial rope) and the ungated MLP (models/jais2.UngatedMLP) in
parallel, or two (cfg.mlp_norm: GPT-NeoX, Falcon 40B), one for each; the head's bias is llama.CausalLM's.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.jais2 import UngatedMLP
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, o_bias=cfg.attention_bias)
        self.mlp = UngatedMLP(cfg, bias=cfg.mlp_bias)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.mlp_norm:  # GPT-NeoX / Falcon 40B: the MLP reads a LayerNorm of its own of the same stream
            self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp_norm = cfg.mlp_norm

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = self.input_layernorm(x)
        mlp_in = self.post_attention_layernorm(x) if self.mlp_norm else h
        return x + self.self_attn(h, meta) + self.mlp(mlp_in)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm
