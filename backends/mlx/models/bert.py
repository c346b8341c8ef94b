"""BERT-style encoders in MLX: BERT, RoBERTa, MPNet, Nomic BERT (app/models/family_bert.py has the maths
and the tensor names).

No KV cache and no rope: each sequence of the flattened batch arrives whole (the engine schedules
an encoder's prompts in one piece) and attends over itself both ways, the sequences padded into
one [S, L] batch for fast.scaled_dot_product_attention with the padding keys masked out (MPNet:
its relative-position bias added to that mask; Nomic BERT: fast.rope at offset 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.family_bert import mpnet_buckets
from lantern.app.models.spec import ModelConfig

ACTIVATIONS = {"gelu": nn.gelu, "gelu_tanh": nn.gelu_approx, "silu": nn.silu, "relu": nn.relu}


@dataclass
class EncoderInputs:
    """backends/pooling_plan.EncoderLayout as arrays, plus each token's position and type."""

    positions: mx.array  # [T]
    token_types: mx.array  # [T]
    gather: mx.array  # [S, L]
    key_mask: mx.array  # [S, 1, 1, L] bool: True where a key is a real token
    scatter: mx.array  # [T]
    attn_mask: mx.array | None = None  # [S, H, L, L] float: key_mask plus MPNet's bias (set by the model)


def padded_positions(input_ids: mx.array, inputs: EncoderInputs, padding_idx: int) -> mx.array:
    """RoBERTa's and MPNet's positions [T]: padding_idx + the count of non-padding tokens so far in
    the sequence, padding_idx for a padding token (create_position_ids_from_input_ids)."""
    real = (input_ids[inputs.gather] != padding_idx) & inputs.key_mask[:, 0, 0, :]
    counted = mx.where(real, mx.cumsum(real.astype(mx.int32), axis=1) + padding_idx, padding_idx)
    return counted.reshape(-1)[inputs.scatter]


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, enc = cfg.hidden_size, cfg.encoder
        self.padding_idx = enc.padding_idx
        self.word_embeddings = nn.Embedding(cfg.vocab_size, d)
        if enc.rope_theta is None:  # (a rope turns q / k instead)
            self.position_embeddings = nn.Embedding(enc.position_rows, d)
        if enc.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(enc.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=enc.layer_norm_eps)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        h = self.word_embeddings(input_ids)
        if "token_type_embeddings" in self:
            h = h + self.token_type_embeddings(inputs.token_types)
        if "position_embeddings" not in self:
            return self.norm(h)
        positions = inputs.positions
        if self.padding_idx is not None:
            positions = padded_positions(input_ids, inputs, self.padding_idx)
        return self.norm(h + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, enc = cfg.hidden_size, cfg.encoder
        self.n_heads, self.head_dim = cfg.num_heads, d // cfg.num_heads
        self.rope_theta = enc.rope_theta
        bias = enc.linear_bias
        self.q_proj = nn.Linear(d, d, bias=bias)
        self.k_proj = nn.Linear(d, d, bias=bias)
        self.v_proj = nn.Linear(d, d, bias=bias)
        self.o_proj = nn.Linear(d, d, bias=bias)

    def __call__(self, x: mx.array, inputs: EncoderInputs) -> mx.array:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q, k, v = (
            proj(x).reshape(t, self.n_heads, self.head_dim)[inputs.gather].transpose(0, 2, 1, 3)  # [S, H, L, D]
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        if self.rope_theta is not None:  # every padded sequence starts at position 0
            rope = dict(dims=self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=0)
            q, k = mx.fast.rope(q, **rope), mx.fast.rope(k, **rope)
        mask = inputs.key_mask if inputs.attn_mask is None else inputs.attn_mask
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(s * length, -1)[inputs.scatter]
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        enc, d, inter = cfg.encoder, cfg.hidden_size, cfg.intermediate_size
        self.act, self.gated = ACTIVATIONS[enc.hidden_act], enc.gated_mlp
        if self.gated:
            self.gate_proj = nn.Linear(d, inter, bias=enc.linear_bias)
        self.up_proj = nn.Linear(d, inter, bias=enc.linear_bias)
        self.down_proj = nn.Linear(inter, d, bias=enc.linear_bias)

    def __call__(self, x: mx.array) -> mx.array:
        if self.gated:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.act(self.up_proj(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        eps = cfg.encoder.layer_norm_eps
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.mlp = MLP(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=eps)

    def __call__(self, x: mx.array, inputs: EncoderInputs) -> mx.array:
        h = self.attention_norm(x + self.attention(x, inputs))  # post-LN, as BERT
        return self.mlp_norm(h + self.mlp(h))


class BertModel(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/mlx/embed.py runs it

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_layers)]
        if cfg.encoder.relative_buckets:  # MPNet: one [buckets, heads] table shared by every layer
            self.relative_attention_bias = nn.Embedding(cfg.encoder.relative_buckets, cfg.num_heads)
            self._buckets = mx.array(mpnet_buckets(cfg.encoder.position_rows))  # sliced to each batch's longest

    def _relative_mask(self, inputs: EncoderInputs, dtype: mx.Dtype) -> mx.array:
        """MPNet's additive mask [S, H, L, L]: the bias of each (query, key) bucket, -inf at padding keys."""
        length = inputs.gather.shape[1]
        bias = self.relative_attention_bias(self._buckets[:length, :length]).transpose(2, 0, 1).astype(dtype)
        padding = mx.where(inputs.key_mask, mx.array(0.0, dtype), mx.array(-mx.inf, dtype))
        return bias[None] + padding

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache: the smallest pool the engine's block bookkeeping needs
        (one value per token and layer, never written: the MLX pool grows only when written)."""
        return (1, 1, 1, True)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        """The last layer's hidden states [T, hidden_size] for every token of the batch."""
        h = self.embeddings(input_ids, inputs)
        if "relative_attention_bias" in self:
            inputs.attn_mask = self._relative_mask(inputs, h.dtype)
        for layer in self.layers:
            h = layer(h, inputs)
        return h


CausalLM = BertModel  # the name models.build_model looks up in a family's file
