"""OLMo (1) decoder in torch over a flattened token batch (maths in app/models/family_olmo1.py; the MLX file has the
same layout): Llama's decoder layer under LayerNorms without weights or biases; q, k, v clamped where the config
says (layers.Attention, cfg.clip_qkv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class PlainLayerNorm(nn.Module):
    """LayerNorm with no weight or bias (OlmoLayerNorm: computed in float32), with layers.RMSNorm's fused residual
    add: (normed x + r, x + r)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x if residual is None else x + residual
        return F.layer_norm(h.float(), (h.shape[-1],), eps=self.eps).to(h.dtype), h


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)
        self.input_layernorm = PlainLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = PlainLayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainLayerNorm
