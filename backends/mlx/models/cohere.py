"""Cohere Command R7B / Command A (cohere2) and Command R / R+ / Aya (cohere) decoder for MLX over a flattened
token batch (maths in app/models/family_cohere.py; the torch file has the same layout): one LayerNorm per layer
feeding attention and MLP in parallel, the rope on consecutive pairs (Cohere Compass: the halves) and (cohere2) only
on the sliding layers;
Cohere2-MoE's mixture where a layer is sparse (deepseek.DeepSeekMoE: its routing is DeepSeek's).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE
from lantern.backends.mlx.paged_attention import AttentionMetadata


class CohereLayerNorm(nn.Module):
    """(x - mean) / std * weight, in float32 then back to x's dtype (transformers' CohereLayerNorm)."""

    def __init__(self, dims: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x.astype(mx.float32), self.weight.astype(mx.float32), None, self.eps).astype(x.dtype)


class CohereHeadNorm(nn.Module):
    """Command R+'s q/k norm: a LayerNorm over each head with a weight per head ([heads, head_dim])."""

    def __init__(self, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.weight = mx.ones((heads, head_dim))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        normed = mx.fast.layer_norm(x.astype(mx.float32), None, None, self.eps)
        return (self.weight.astype(mx.float32) * normed).astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)  # (pairs or halves: ModelConfig.rope_interleaved)
        if cfg.qk_norm:
            attn = self.self_attn
            attn.q_norm = CohereHeadNorm(attn.n_heads, attn.head_dim, cfg.rms_norm_eps)
            attn.k_norm = CohereHeadNorm(attn.n_kv, attn.head_dim, cfg.rms_norm_eps)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)  # (Cohere2-MoE: DeepSeek's mixture computes it)
        self.mlp = DeepSeekMoE(cfg) if sparse else MLP(cfg)
        norm = nn.RMSNorm if cfg.rms_norm else CohereLayerNorm  # (Cohere2-MoE's rms_norm_eps)
        self.input_layernorm = norm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = self.input_layernorm(x)
        return x + self.self_attn(h, meta) + self.mlp(h)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = CohereLayerNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.rms_norm:
            self.model.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
