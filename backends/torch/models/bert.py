"""BERT-style encoders in torch: BERT, RoBERTa, MPNet, Nomic BERT (app/models/family_bert.py has the
maths and the tensor names).

No KV cache and no rope: each sequence of the flattened batch arrives whole (the engine schedules
an encoder's prompts in one piece) and attends over itself both ways, the sequences padded into
one [S, L] batch for scaled_dot_product_attention with the padding keys masked out (MPNet: its
relative-position bias added to that mask; Nomic BERT: a rope over the padded positions, every
sequence starting at 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.family_bert import mpnet_buckets
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.parallel import TPGroup

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": F.relu}


def rope_table(length: int, dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [L, dim] in float32 for positions 0..L-1, the halves repeated (rotate_half's layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    freqs = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rope on x [..., L, dim] (rotate_half: the two halves of each head turn together)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@dataclass
class EncoderInputs:
    """backends/pooling_plan.EncoderLayout as tensors, plus each token's position and type."""

    positions: torch.Tensor  # [T] int64
    token_types: torch.Tensor  # [T] int64
    gather: torch.Tensor  # [S, L] int64
    key_mask: torch.Tensor  # [S, 1, 1, L] bool: True where a key is a real token
    scatter: torch.Tensor  # [T] int64
    attn_mask: torch.Tensor | None = None  # [S, H, L, L] float: key_mask plus MPNet's bias (set by the model)
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # Nomic BERT's cos, sin [L, head_dim] (set by the model)


def padded_positions(input_ids: torch.Tensor, inputs: EncoderInputs, padding_idx: int) -> torch.Tensor:
    """RoBERTa's and MPNet's positions [T]: padding_idx + the count of non-padding tokens so far in
    the sequence, padding_idx for a padding token (create_position_ids_from_input_ids)."""
    real = (input_ids[inputs.gather] != padding_idx) & inputs.key_mask[:, 0, 0, :]
    counted = torch.where(real, real.long().cumsum(1) + padding_idx, padding_idx)
    return counted.reshape(-1)[inputs.scatter]


def _embedding(rows: int, dim: int) -> nn.Embedding:
    # An explicit (meta) weight skips the random init, which imports torch._dynamo (~3 s).
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, enc = cfg.hidden_size, cfg.encoder
        self.padding_idx = enc.padding_idx
        self.word_embeddings = _embedding(cfg.vocab_size, d)
        if enc.rope_theta is None:  # (a rope turns q / k instead)
            self.position_embeddings = _embedding(enc.position_rows, d)
        if enc.type_vocab_size:
            self.token_type_embeddings = _embedding(enc.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=enc.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        h = self.word_embeddings(input_ids)
        if hasattr(self, "token_type_embeddings"):
            h = h + self.token_type_embeddings(inputs.token_types)
        if not hasattr(self, "position_embeddings"):
            return self.norm(h)
        positions = inputs.positions
        if self.padding_idx is not None:
            positions = padded_positions(input_ids, inputs, self.padding_idx)
        return self.norm(h + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        d = cfg.hidden_size
        self.splits = [d, d, d]
        bias = cfg.encoder.linear_bias
        self.qkv_proj = nn.Linear(d, 3 * d, bias=bias)  # query, key, value stacked by weights.py
        self.o_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q, k, v = (
            p.reshape(t, self.n_heads, self.head_dim)[inputs.gather].transpose(1, 2)  # [S, H, L, D]
            for p in self.qkv_proj(x).split(self.splits, dim=-1)
        )
        if inputs.rope is not None:
            q, k = rotate(q, *inputs.rope), rotate(k, *inputs.rope)
        mask = inputs.key_mask if inputs.attn_mask is None else inputs.attn_mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(s * length, -1)[inputs.scatter]
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        enc, d, inter = cfg.encoder, cfg.hidden_size, cfg.intermediate_size
        self.act, self.gated = ACTIVATIONS[enc.hidden_act], enc.gated_mlp
        if self.gated:  # gate and up stacked by weights.py
            self.gate_up_proj = nn.Linear(d, 2 * inter, bias=enc.linear_bias)
        else:
            self.up_proj = nn.Linear(d, inter, bias=enc.linear_bias)
        self.down_proj = nn.Linear(inter, d, bias=enc.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
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
        if cfg.encoder.relative_buckets:  # MPNet: one [buckets, heads] table shared by every layer
            self.relative_attention_bias = _embedding(cfg.encoder.relative_buckets, cfg.num_heads)
            self._buckets: torch.Tensor | None = None  # [rows, rows] for the longest input, sliced per batch

    def _relative_mask(self, inputs: EncoderInputs, dtype: torch.dtype) -> torch.Tensor:
        """MPNet's additive mask [S, H, L, L]: the bias of each (query, key) bucket, -inf at padding keys."""
        length = inputs.gather.shape[1]
        if self._buckets is None or self._buckets.device != inputs.gather.device:
            rows = self.cfg.encoder.position_rows
            self._buckets = torch.from_numpy(mpnet_buckets(rows)).to(inputs.gather.device)
        bias = self.relative_attention_bias(self._buckets[:length, :length]).permute(2, 0, 1).to(dtype)
        padding = torch.zeros(inputs.key_mask.shape, dtype=dtype, device=bias.device)
        return bias[None] + padding.masked_fill(~inputs.key_mask, float("-inf"))

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache: the smallest pool the engine's block bookkeeping needs
        (one value per token and layer, never written; a CPU pool commits no memory for it)."""
        return (1, 1, 1, True)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        """The last layer's hidden states [T, hidden_size] for every token of the batch."""
        h = self.embeddings(input_ids, inputs)
        if hasattr(self, "relative_attention_bias"):
            inputs.attn_mask = self._relative_mask(inputs, h.dtype)
        theta = self.cfg.encoder.rope_theta
        if theta is not None:
            head_dim = self.cfg.hidden_size // self.cfg.num_heads
            inputs.rope = rope_table(inputs.gather.shape[1], head_dim, theta, input_ids.device)
        for layer in self.layers:
            h = layer(h, inputs)
        return h


CausalLM = BertModel  # the name models.build_model looks up in a family's file
