"""IQuest-Coder-V1 Loop in torch over a flattened token batch (maths in app/models/family_iquest_loop.py; the MLX file
has the same layout): Llama's layers run twice; the second pass mixes attention to the first pass's K/V (pool layer
i) with a sliding window over its own (pool layer num_layers + i) by a per-head gate of the query.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup, parallel_embed

KV = tuple[torch.Tensor, torch.Tensor]


class LoopGate(nn.Module):
    """sigmoid(q . weight[h] + bias[h]) per token and head: [T, H, 1] from the rotated queries [T, H, D]."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, head_dim), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(heads), requires_grad=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid((q * self.weight).sum(-1) + self.bias)[..., None]


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        attn = Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias)  # (attention_bias: o_proj's too)
        super().__init__(cfg, layer_idx, tp, attn=attn)
        attn.loop_gate = LoopGate(attn.n_heads, attn.head_dim)
        self.window, self.second_pool_layer = cfg.loop_window, cfg.num_layers + layer_idx

    def first_pass(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """Llama's layer over pool layer i; also this step's K/V, which the second pass attends to."""
        h, residual = self.input_layernorm(x, residual)
        a = self.self_attn
        q, k, v = a.qkv(h, meta)
        out = paged_attention(q, k, v, meta, a.layer_idx, a.scale)
        h, residual = self.post_attention_layernorm(a.tp.all_reduce(a.o_proj(out.flatten(1))), residual)
        return self.mlp(h), residual, (k, v)

    def second_pass(
        self, x: torch.Tensor, residual: torch.Tensor, meta: TorchAttentionMetadata, first: KV
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        a = self.self_attn
        q, k, v = a.qkv(h, meta)
        gate = a.loop_gate(q)
        # (write False: the first pass wrote these K/V to pool layer i; a prefill without a prefix reads them here)
        whole = paged_attention(q, first[0], first[1], meta, a.layer_idx, a.scale, write=False)
        local = paged_attention(q, k, v, meta, self.second_pool_layer, a.scale, window=self.window)
        mixed = gate * whole + (1 - gate) * local
        h, residual = self.post_attention_layernorm(a.tp.all_reduce(a.o_proj(mixed.flatten(1))), residual)
        return self.mlp(h), residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        h, residual = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size), None
        firsts = []
        for layer in self.model.layers:
            h, residual, kv = layer.first_pass(h, residual, meta)
            firsts.append(kv)
        for layer, kv in zip(self.model.layers, firsts):
            h, residual = layer.second_pass(h, residual, meta, kv)
        return self.model.norm(h[rows], residual[rows])[0]
