"""BERT encoder in MLX (app/models/family_bert.py has the maths and the tensor names).

No KV cache and no rope: each sequence of the flattened batch arrives whole (the engine schedules
an encoder's prompts in one piece) and attends over itself both ways, the sequences padded into
one [S, L] batch for fast.scaled_dot_product_attention with the padding keys masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig

ACTIVATIONS = {"gelu": nn.gelu, "gelu_tanh": nn.gelu_approx}


@dataclass
class EncoderInputs:
    """backends/pooling_plan.EncoderLayout as arrays, plus each token's position and type."""

    positions: mx.array  # [T]
    token_types: mx.array  # [T]
    gather: mx.array  # [S, L]
    key_mask: mx.array  # [S, 1, 1, L] bool: True where a key is a real token
    scatter: mx.array  # [T]


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, d)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(cfg.encoder.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=cfg.encoder.layer_norm_eps)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(inputs.token_types)
        return self.norm(h + self.position_embeddings(inputs.positions))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden_size
        self.n_heads, self.head_dim = cfg.num_heads, d // cfg.num_heads
        self.q_proj = nn.Linear(d, d, bias=True)
        self.k_proj = nn.Linear(d, d, bias=True)
        self.v_proj = nn.Linear(d, d, bias=True)
        self.o_proj = nn.Linear(d, d, bias=True)

    def __call__(self, x: mx.array, inputs: EncoderInputs) -> mx.array:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q, k, v = (
            proj(x).reshape(t, self.n_heads, self.head_dim)[inputs.gather].transpose(0, 2, 1, 3)  # [S, H, L, D]
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=inputs.key_mask)
        out = out.transpose(0, 2, 1, 3).reshape(s * length, -1)[inputs.scatter]
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.encoder.hidden_act]
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def __call__(self, x: mx.array) -> mx.array:
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

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache: the smallest pool the engine's block bookkeeping needs
        (one value per token and layer, never written: the MLX pool grows only when written)."""
        return (1, 1, 1, True)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        """The last layer's hidden states [T, hidden_size] for every token of the batch."""
        h = self.embeddings(input_ids, inputs)
        for layer in self.layers:
            h = layer(h, inputs)
        return h


CausalLM = BertModel  # the name models.build_model looks up in a family's file
