"""Zamba (v1) in torch over a flattened token batch (maths in app/models/family_zamba.py; the MLX file has the same
layout): every layer a multi-head Mamba-1 mixer block (models/mamba.py's mixer and state slots, one per layer); a
hybrid layer first runs the one shared transformer block on [x, embedding] with its own K/V pool layer, and adds
linear(block output) to its mixer's input.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import mamba
from lantern.backends.torch.parallel import TPGroup, parallel_embed


class SharedBlock(nn.Module):
    """Attention over RMSNorm([x, e]) (no rope), then the gated MLP over RMSNorm(attention), no residual."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(2 * cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 0, tp, input_size=2 * cfg.hidden_size)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = MLP(cfg, tp)

    def forward(self, x: torch.Tensor, embedded: torch.Tensor, meta: TorchAttentionMetadata, kv_layer: int):
        h = self.input_layernorm(torch.cat([x, embedded], dim=-1))[0]
        h = self.self_attn(h, meta, kv_layer=kv_layer)
        return self.feed_forward(self.pre_ff_layernorm(h)[0])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.mamba = mamba.Mamba1Mixer(cfg, layer_idx)  # (every layer keeps a state)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        hybrid = cfg.zamba2.hybrid_layers
        self.kv_layer = hybrid.index(layer_idx) if layer_idx in hybrid else None
        if self.kv_layer is not None:
            self.linear = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        embedded: torch.Tensor,
        meta: TorchAttentionMetadata,
        state: mamba.MambaState,
        shared: SharedBlock,
    ) -> torch.Tensor:
        h = x if self.kv_layer is None else x + self.linear(shared(x, embedded, meta, self.kv_layer))
        return x + self.mamba(self.input_layernorm(h)[0], meta, state)


class CausalLM(mamba.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.shared_transformers = nn.ModuleList([SharedBlock(cfg, tp)])

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        embedded = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        h, shared = embedded, self.model.shared_transformers[0]
        for layer in self.model.layers:
            h = layer(h, embedded, meta, self.state, shared)
        return self.model.norm(h[rows])[0]
