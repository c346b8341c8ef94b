"""Talkie in torch over a flattened token batch (maths in app/models/family_talkie.py; the MLX file has the same
layout): NanoChat's weightless norms and reversed rope, q times a gain per head, a SiLU-gated MLP, each sublayer's
output times a learned scalar and the normed embedding added back after every block, the logits times a gain.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.llama4 import L2Norm as PlainRMSNorm
from lantern.backends.torch.parallel import TPGroup, parallel_embed


def _scalar(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.ones(*shape), requires_grad=False)


class HeadGainAttention(Attention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, norm=PlainRMSNorm)
        self.head_gain = _scalar(self.n_heads)

    def qkv(self, x: torch.Tensor, meta: TorchAttentionMetadata, *args: object) -> tuple[torch.Tensor, ...]:
        q, k, v = super().qkv(x, meta, *args)
        return q * self.head_gain[:, None].to(q.dtype), k, v


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, attn=HeadGainAttention(cfg, layer_idx, tp))
        self.input_layernorm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn_gain, self.mlp_gain, self.embed_skip = _scalar(1), _scalar(1), _scalar(1)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, embedded: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(as Llama's: x the previous block's output, added to the residual stream by this block's first norm)"""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, meta) * self.attn_gain, residual)
        return self.mlp(h) * self.mlp_gain + embedded * self.embed_skip, residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainRMSNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.embed_norm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.model.lm_head_gain = _scalar(1)

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_norm(parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size))[0]
        x, residual = h, None
        for layer in self.model.layers:
            x, residual = layer(x, residual, meta, h)
        return self.model.norm(x[rows], residual[rows])[0]

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        logits = super()._head(h)
        return logits * self.model.lm_head_gain.to(logits.dtype)
