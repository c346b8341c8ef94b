"""Jamba decoder in MLX over a flattened token batch (maths in app/models/family_jamba.py; the torch file has the
same layout): Mamba-1 mixers keeping a state per sequence among attention layers without positional encoding over
the paged pool (attention layers only); every layer's MLP a mixture of experts or a gated MLP.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.mamba import Mamba1Mixer, MambaState
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.mamba1.mamba_layers
        before = sum(kinds[:layer_idx])  # Mamba layers before this one
        if kinds[layer_idx]:
            self.mamba = Mamba1Mixer(cfg, before)
        else:  # its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, layer_idx - before)
        self.mlp = feed_forward(cfg, layer_idx)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: MambaState) -> mx.array:
        h = self.input_layernorm(x)
        mixer = self.get("mamba")
        h = x + (mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta))
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        conv, ssm = self.cfg.mamba1.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba1.mamba_layers) * (conv * dtype.size + ssm * 4)
