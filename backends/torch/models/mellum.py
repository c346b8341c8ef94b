"""JetBrains Mellum 2 decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_mellum.py): Llama's pre-norm layer with Qwen3's per-head q/k norms and Qwen3-MoE's mixture
(layers.feed_forward), its sliding layers on a plain rope of their own base (Gemma 3's arrangement: gemma.CausalLM
builds that table).
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import RMSNorm
from lantern.backends.torch.models import gemma, llama
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup, mlp: nn.Module | None = None):
        """mlp: the family's own (Laguna's DeepSeek mixture); else layers.feed_forward's."""
        super().__init__(cfg, layer_idx, tp, mlp=mlp)
        self.local_rope = self.self_attn.window is not None and cfg.local_rope_theta is not None

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        local_rope: gemma.Rope | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        attn = self.self_attn(h, meta, local_rope if self.local_rope else None)
        h, residual = self.post_attention_layernorm(attn, residual)
        return self.mlp(h), residual


class CausalLM(gemma.CausalLM):
    """Gemma's shell for the sliding layers' rope table (layer_extras); Llama's norms and embedding."""

    decoder_layer = DecoderLayer
    final_norm = RMSNorm
