"""Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2, Qwen3) over a flattened token batch.

Differences between the architectures are flags on ModelConfig (qkv bias, q/k norm, tied
embeddings, rope scaling); attention goes through the paged KV pool in paged_attention.py.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        d = cfg.hidden_size
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(self.head_dim, cfg.rope_theta, False, cfg.rope_scaling, cfg.max_position_embeddings)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        t = x.shape[0]
        q = self.q_proj(x).reshape(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).reshape(t, self.n_kv, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        # Every token has its own position: treat tokens as a batch of length-1 sequences so
        # rope takes one offset per token.
        q = self.rope(q[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        k = self.rope(k[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        out = paged_attention(q, k, v, meta, self.layer_idx, self.scale)
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [DecoderLayer(cfg, i) for i in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


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
        for layer in self.model.layers:
            h = layer(h, meta)
        if logits_idx.size == 0:  # a prefill chunk short of the prompt's end (quantized_matmul traps on 0 rows)
            return mx.zeros((0, self.cfg.vocab_size), dtype=h.dtype)
        h = self.model.norm(h[logits_idx])
        if self.cfg.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)
