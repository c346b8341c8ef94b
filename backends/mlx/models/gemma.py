"""Gemma 2 / Gemma 3 (text) decoder over a flattened token batch.

What differs from the Llama file: RMSNorm scales by (1 + weight) in float32, embeddings are
multiplied by sqrt(hidden_size) (rounded to the model dtype, as transformers does), sandwich norms
around attention and MLP, GeGLU, and the logits are soft-capped. Windows, the attention soft-cap,
the query scale and Gemma 3's local rope base are read from ModelConfig by layers.Attention.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in float32, then back to x's dtype (transformers' Gemma
    norm: the (1 + w) is not rounded to bfloat16 first)."""

    offset = 1.0  # (FloatRMSNorm: 0, the weight as stored)

    def __init__(self, dims: int, eps: float = 1e-6):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        scale = self.offset + self.weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), scale, self.eps).astype(x.dtype)


class FloatRMSNorm(GemmaRMSNorm):
    """x / rms(x) * weight, the product in float32 and one rounding (Muse Glimmer's final norm)."""

    offset = 0.0


class DecoderLayer(nn.Module):
    qk_norm: type[nn.Module] = GemmaRMSNorm  # the per-head q/k norms' class, when the config has them

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, norm=self.qk_norm)
        self.mlp = feed_forward(cfg, layer_idx)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.sandwich = cfg.sandwich_norms  # (VaultGemma has no norm after attention nor after the MLP)
        if self.sandwich:  # (their eps: post_norm_eps where it differs, Muse Glimmer's)
            post_eps = cfg.post_norm_eps if cfg.post_norm_eps is not None else eps
            self.post_attention_layernorm = GemmaRMSNorm(d, post_eps)
            self.post_feedforward_layernorm = GemmaRMSNorm(d, post_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        if not self.sandwich:
            h = x + self.self_attn(self.input_layernorm(x), meta)
            return h + self.mlp(self.pre_feedforward_layernorm(h))
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), meta))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = GemmaRMSNorm
