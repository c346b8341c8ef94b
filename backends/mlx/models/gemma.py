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
from lantern.backends.mlx.paged_attention import AttentionMetadata


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in float32, then back to x's dtype (transformers' Gemma
    norm: the (1 + w) is not rounded to bfloat16 first)."""

    def __init__(self, dims: int, eps: float = 1e-6):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        scale = 1.0 + self.weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), scale, self.eps).astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, norm=GemmaRMSNorm)
        self.mlp = feed_forward(cfg, layer_idx)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.post_attention_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(d, eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), meta))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [DecoderLayer(cfg, i) for i in range(cfg.num_layers)]
        self.norm = GemmaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def __call__(self, input_ids: mx.array, meta: AttentionMetadata, logits_idx: mx.array) -> mx.array:
        """Hidden states for all tokens; logits only for rows in logits_idx (the sampled ones)."""
        h = self.model.embed_tokens(input_ids)
        # sqrt(hidden_size) in the embedding's dtype: bfloat16 rounds sqrt(3072) to 55.5, like transformers.
        h = h * mx.array(self.cfg.hidden_size**0.5, dtype=h.dtype)
        for layer in self.model.layers:
            h = layer(h, meta)
        if logits_idx.size == 0:  # a prefill chunk short of the prompt's end (quantized_matmul traps on 0 rows)
            return mx.zeros((0, self.cfg.vocab_size), dtype=h.dtype)
        h = self.model.norm(h[logits_idx])
        if self.cfg.tie_word_embeddings:
            logits = self.model.embed_tokens.as_linear(h)
        else:
            logits = self.lm_head(h)
        cap = self.cfg.final_softcap
        return logits if cap is None else mx.tanh(logits / cap) * cap
