"""GLM-4 decoder in torch (GLM-4-9B/32B-0414, GLM-Z1) over a flattened token batch: the same
layout as the MLX file. The rope rotates consecutive pairs of the first rotary_dim dims of each
head (layers.Attention with rope_interleaved; the runner's rope table is rotary_dim wide), and each
sublayer's output is normed before the residual add, which the next norm fuses in.

Tensor parallelism works as for Llama: attention and MLP all-reduce their outputs before the
(replicated) post-sublayer norms see them.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, RMSNorm, feed_forward
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp, rope_interleaved=True)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_self_attn_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)  # the MLP's input norm, despite its name
        self.post_mlp_layernorm = RMSNorm(d, eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's normed MLP output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        attn = self.post_self_attn_layernorm(self.self_attn(h, meta))[0]
        h, residual = self.post_attention_layernorm(attn, residual)
        return self.post_mlp_layernorm(self.mlp(h))[0], residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
