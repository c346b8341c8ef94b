"""Llama 4 decoder in torch over a flattened token batch (maths in app/models/family_llama4.py; the MLX file has
the same layout): Llama's decoder layer with pair-wise rope; rope layers L2-normalise each head's q and k after
it, NoPE layers scale their queries by position instead; the MLP is a dense one or a mixture whose one chosen
expert sees the token scaled by the sigmoid of its router logit, beside a shared expert.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.family_llama4 import layer_attention_config
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import MLP, Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE
from lantern.backends.torch.parallel import TPGroup


class L2Norm(nn.Module):
    """x / rms(x) in float32, no weight (transformers' Llama4TextL2Norm, NanoChat's RMSNorm), with layers.RMSNorm's
    fused residual add: (normed x + r, x + r)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x if residual is None else x + residual
        f = h.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)).to(h.dtype), h


class Llama4MoE(SparseMoE):
    """The routed expert's input is the token times sigmoid(its logit); a shared expert beside it."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__(cfg, tp)
        self.shared_expert = MLP(cfg, tp, cfg.moe.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, ids = torch.topk(self.gate(x), 1, dim=-1)
        scale = torch.sigmoid(logits.float()).to(x.dtype)
        return self.routed(x * scale, ids, torch.ones_like(scale)) + self.shared_expert(x)


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        attn = Attention(layer_attention_config(cfg, layer_idx), layer_idx, tp, norm=L2Norm, rope_interleaved=True)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        super().__init__(cfg, layer_idx, tp, attn=attn, mlp=Llama4MoE(cfg, tp) if sparse else MLP(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
