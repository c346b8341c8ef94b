"""HRM-Text in torch over a flattened token batch (maths in app/models/family_hrm_text.py; the MLX file has the same
layout): the checkpoint's 2 x layers_per_stack layers (the L stack's, then the H stack's) run in cycles, each pass
of a stack reading and writing its own layers of the KV pool (layers.Attention's kv_layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup, parallel_embed


class PlainRMSNorm(nn.Module):
    """RMSNorm without a weight, in float32 (HrmTextRMSNorm), called as layers.RMSNorm: (normed x + r, x + r)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x if residual is None else x + residual
        return F.rms_norm(h.float(), (h.shape[-1],), None, self.eps).to(h.dtype), h


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer under weightless norms; attention gated per channel (cfg.attn_output_gate)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.mlp = MLP(cfg, tp)
        self.norm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, kv_layer: int) -> torch.Tensor:
        h = x + self.self_attn(self.norm(x)[0], meta, kv_layer=kv_layer)
        return h + self.mlp(self.norm(h)[0])


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainRMSNorm  # (each stack's closing norm: the same weightless one)

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.z_L_init = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        cycles, layers = self.cfg.hrm, self.model.layers
        per_stack = cycles.layers_per_stack
        high = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size) * self.cfg.embed_multiplier
        low = self.model.z_L_init.to(high.dtype).expand_as(high)
        for stack, first in cycles.passes():
            x = low + high
            for i, layer in enumerate(layers[:per_stack] if stack == "L" else layers[per_stack:]):
                x = layer(x, meta, first + i)
            x = self.model.norm(x)[0]
            low, high = (x, high) if stack == "L" else (low, x)
        return high[rows]
