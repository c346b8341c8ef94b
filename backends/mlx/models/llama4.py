"""Llama 4 decoder in MLX over a flattened token batch (maths in app/models/family_llama4.py; the torch file has
the same layout): Llama's decoder layer with pair-wise rope; rope layers L2-normalise each head's q and k after
it, NoPE layers scale their queries by position instead; the MLP is a dense one or a mixture whose one chosen
expert sees the token scaled by the sigmoid of its router logit, beside a shared expert.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.family_llama4 import layer_attention_config
from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.moe import SparseMoE


class L2Norm(nn.Module):
    """x / rms(x) in float32, no weight (transformers' Llama4TextL2Norm, NanoChat's RMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        f = x.astype(mx.float32)
        return (f * mx.rsqrt((f * f).mean(-1, keepdims=True) + self.eps)).astype(x.dtype)


class Llama4MoE(SparseMoE):
    """The routed expert's input is the token times sigmoid(its logit); a shared expert beside it."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.shared_expert = MLP(cfg, cfg.moe.intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        logits = self.gate(x)
        ids = mx.argmax(logits, axis=-1, keepdims=True)
        scale = mx.sigmoid(mx.take_along_axis(logits, ids, axis=-1).astype(mx.float32)).astype(x.dtype)
        return self.experts(x * scale, ids)[:, 0] + self.shared_expert(x)


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        attn = Attention(layer_attention_config(cfg, layer_idx), layer_idx, norm=L2Norm, rope_interleaved=True)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        super().__init__(cfg, layer_idx, attn=attn, mlp=Llama4MoE(cfg) if sparse else MLP(cfg))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
