"""Jamba decoder in torch over a flattened token batch (maths in app/models/family_jamba.py; the MLX file has the
same layout): Mamba-1 mixers (models/mamba.py's, with weighted dt / B / C norms) keeping a state per sequence among
attention layers without positional encoding over the paged pool (attention layers only); every layer's MLP a
mixture of experts or a gated MLP (layers.feed_forward).
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, RMSNorm, feed_forward
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.mamba import Mamba1Mixer, MambaState
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.mamba1.mamba_layers
        before = sum(kinds[:layer_idx])  # Mamba layers before this one
        if kinds[layer_idx]:
            self.mamba = Mamba1Mixer(cfg, before)
        else:  # its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, layer_idx - before, tp)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: MambaState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "mamba", None)
        h = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        conv, ssm = self.cfg.mamba1.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba1.mamba_layers) * (conv * dtype.itemsize + ssm * 4)
