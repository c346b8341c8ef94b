"""Phi-1 / 1.5 / 2, GPT-NeoX and Falcon decoder in torch over a flattened token batch (maths in
app/models/family_phi.py and family_gptneox.py; the MLX file has the same layout): one LayerNorm with a bias
feeding attention (biases where the config says, a partial rope) and the ungated MLP (models/jais2.UngatedMLP) in
parallel, or two (cfg.mlp_norm: GPT-NeoX, Falcon 40B), one for each; the head's bias is llama.CausalLM's.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, LayerNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.jais2 import UngatedMLP
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias)
        self.mlp = UngatedMLP(cfg, tp, bias=cfg.mlp_bias)
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # GPT-NeoX / Falcon 40B: the MLP reads a LayerNorm of its own of the same stream
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.mlp_norm else None

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        mlp_in = h if self.post_attention_layernorm is None else self.post_attention_layernorm(residual)[0]
        return self.self_attn(h, meta) + self.mlp(mlp_in), residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = LayerNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:  # (each rank would add the output projections' biases before the all-reduce sums them)
            raise ValueError(
                "tensor parallelism is not implemented for this parallel block's output biases; serve this model with "
                "--tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)
