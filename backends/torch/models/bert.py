"""BERT encoder in torch (app/models/family_bert.py has the maths and the tensor names).

No KV cache and no rope: each sequence of the flattened batch arrives whole (the engine schedules
an encoder's prompts in one piece) and attends over itself both ways, the sequences padded into
one [S, L] batch for scaled_dot_product_attention with the padding keys masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.parallel import TPGroup

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


@dataclass
class EncoderInputs:
    """backends/pooling_plan.EncoderLayout as tensors, plus each token's position and type."""

    positions: torch.Tensor  # [T] int64
    token_types: torch.Tensor  # [T] int64
    gather: torch.Tensor  # [S, L] int64
    key_mask: torch.Tensor  # [S, 1, 1, L] bool: True where a key is a real token
    scatter: torch.Tensor  # [T] int64


def _embedding(rows: int, dim: int) -> nn.Embedding:
    # An explicit (meta) weight skips the random init, which imports torch._dynamo (~3 s).
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden_size
        self.word_embeddings = _embedding(cfg.vocab_size, d)
        self.position_embeddings = _embedding(cfg.max_position_embeddings, d)
        self.token_type_embeddings = _embedding(cfg.encoder.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=cfg.encoder.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(inputs.token_types)
        return self.norm(h + self.position_embeddings(inputs.positions))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        d = cfg.hidden_size
        self.splits = [d, d, d]
        self.qkv_proj = nn.Linear(d, 3 * d, bias=True)  # query, key, value stacked by weights.py
        self.o_proj = nn.Linear(d, d, bias=True)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q, k, v = (
            p.reshape(t, self.n_heads, self.head_dim)[inputs.gather].transpose(1, 2)  # [S, H, L, D]
            for p in self.qkv_proj(x).split(self.splits, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.key_mask)
        out = out.transpose(1, 2).reshape(s * length, -1)[inputs.scatter]
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.encoder.hidden_act]
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        eps = cfg.encoder.layer_norm_eps
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.mlp = MLP(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=eps)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        h = self.attention_norm(x + self.attention(x, inputs))  # post-LN, as BERT
        return self.mlp_norm(h + self.mlp(h))


class BertModel(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/torch/embed.py runs it

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__()
        if tp.active:
            raise ValueError("tensor parallelism is not implemented for BERT encoders")
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.num_layers)])

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache: the smallest pool the engine's block bookkeeping needs
        (one value per token and layer, never written; a CPU pool commits no memory for it)."""
        return (1, 1, 1, True)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        """The last layer's hidden states [T, hidden_size] for every token of the batch."""
        h = self.embeddings(input_ids, inputs)
        for layer in self.layers:
            h = layer(h, inputs)
        return h


CausalLM = BertModel  # the name models.build_model looks up in a family's file
