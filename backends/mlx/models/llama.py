"""Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2/3, Phi-3, and the Mixtral / Qwen-MoE
mixtures through layers.feed_forward) over a flattened token batch.

Differences between the architectures are flags on ModelConfig (qkv bias, q/k norm, tied
embeddings, rope scaling, windows, experts); attention goes through the paged KV pool.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, attn: nn.Module | None = None, mlp: nn.Module | None = None):
        """attn / mlp: a family's own sublayers (gpt-oss, DeepSeek) under Llama's norms and forward."""
        super().__init__()
        self.self_attn = attn if attn is not None else Attention(cfg, layer_idx)
        self.mlp = mlp if mlp is not None else feed_forward(cfg, layer_idx)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.residual_multiplier = cfg.residual_multiplier  # Granite's; 1.0 elsewhere
        self.post_norms = cfg.post_norms  # HyperCLOVA X: each sublayer's output normed before the residual add
        if self.post_norms:
            self.post_norm1 = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.post_norm2 = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        m, post = self.residual_multiplier, self.post_norms
        attn = self.self_attn(self.input_layernorm(x), meta)
        attn = self.post_norm1(attn) if post else attn
        h = x + (attn if m == 1.0 else attn * m)
        out = self.mlp(self.post_attention_layernorm(h))
        out = self.post_norm2(out) if post else out
        return h + (out if m == 1.0 else out * m)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_cls: type[nn.Module] = DecoderLayer, norm_cls: type = nn.RMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if cfg.learned_positions:  # GPT-2's absolute position table (read at each token's position)
            self.embed_positions = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        if cfg.embed_norm:  # BLOOM's word_embeddings_layernorm
            self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [layer_cls(cfg, i) for i in range(cfg.num_layers)]
        self.norm = norm_cls(cfg.hidden_size, eps=cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """The shell every family shares: other model files subclass it naming their decoder layer
    and final norm."""

    decoder_layer: type[nn.Module] = DecoderLayer
    final_norm: type = nn.RMSNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, self.decoder_layer, self.final_norm)
        if not cfg.tie_word_embeddings:
            rows = cfg.head_rows or cfg.vocab_size  # (Apertus 1.5's pruned head)
            self.lm_head = nn.Linear(cfg.hidden_size, rows, bias=cfg.lm_head_bias)  # (PhiMoE's has one)

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        """Every token through the layers; the final norm's output at the flattened batch's `rows`:
        what the head reads, and what an embedding pools (backends/mlx/embed.py)."""
        h = self.model.embed_tokens(input_ids)
        if self.cfg.embed_scale:  # sqrt(hidden_size) in the embedding's dtype (bf16: 55.5 for 3072), like transformers
            h = h * mx.array(self.cfg.hidden_size**0.5, dtype=h.dtype)
        if self.cfg.embed_multiplier != 1.0:  # Granite: a Python float times the embedding, as transformers
            h = h * self.cfg.embed_multiplier
        if self.cfg.learned_positions:
            h = h + self.model.embed_positions(meta.positions)
        if self.cfg.embed_norm:
            h = self.model.embed_norm(h)
        extras = self.layer_extras(meta)
        for layer in self.model.layers:
            h = layer(h, meta, *extras)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])

    def layer_extras(self, meta: AttentionMetadata) -> tuple:
        """Inputs every decoder layer takes after (x, meta); none for Llama."""
        return ()

    def __call__(self, input_ids: mx.array, meta: AttentionMetadata, logits_idx: mx.array) -> mx.array:
        """Hidden states for all tokens; logits only for rows in logits_idx (the sampled ones)."""
        h = self.hidden_states(input_ids, meta, logits_idx)
        if logits_idx.size == 0:  # a prefill chunk short of the prompt's end (quantized_matmul traps on 0 rows)
            return mx.zeros((0, self.cfg.vocab_size), dtype=h.dtype)
        if self.cfg.tie_word_embeddings:
            logits = self.model.embed_tokens.as_linear(h)
        else:
            logits = self.lm_head(h)
        if self.cfg.logits_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.cfg.logits_divisor
        cap = self.cfg.final_softcap
        logits = logits if cap is None else mx.tanh(logits / cap) * cap
        if self.cfg.head_rows:  # (the ids past a pruned head are never chosen)
            logits = mx.pad(logits, [(0, 0), (0, self.cfg.vocab_size - self.cfg.head_rows)], constant_values=-mx.inf)
        return logits


class RecurrentCausalLM(CausalLM):
    """The shell of the hybrids whose layers keep a state per sequence beside the paged pool (LFM2, Qwen3-Next,
    Granite 4.0-H, Nemotron-H): the runner allocates `state_cls(cfg, slots, dtype)` (its arrays(): what an
    evaluation must materialise) and every layer takes it after (x, meta). Each family sizes its state."""

    state_cls: type

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.recurrent = None  # (not `state`: nn.Module has a property of that name)

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        raise NotImplementedError

    def allocate_state(self, slots: int, dtype: mx.Dtype) -> None:
        self.recurrent = self.state_cls(self.cfg, slots, dtype)

    def state_arrays(self) -> list[mx.array]:
        return [] if self.recurrent is None else self.recurrent.arrays()

    def layer_extras(self, meta: AttentionMetadata) -> tuple:
        return (self.recurrent,)
