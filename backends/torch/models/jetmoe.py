"""JetMoE in torch over a flattened token batch (maths in app/models/family_jetmoe.py; the MLX file has the same
layout): Llama's layer with a mixture of attention heads (MoA: routed query and output projections around one
shared K/V) and a mixture of SiLU-gated experts, each plus a bias.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.layers import RMSNorm, apply_rotary
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE
from lantern.backends.torch.parallel import TPGroup


def route(logits: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k experts of float32 router logits and their weights, a softmax over those k in `dtype`."""
    top, ids = logits.float().topk(k, dim=-1)
    return ids, top.softmax(dim=-1).to(dtype)


class MixtureOfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        moe, d = cfg.moe, cfg.hidden_size
        self.layer_idx, self.k, self.kv, self.head_dim = layer_idx, moe.top_k, cfg.num_kv_heads, cfg.head_dim
        width = self.kv * self.head_dim
        self.router = nn.Linear(d, moe.num_experts, bias=False)
        self.q_experts = nn.Parameter(torch.empty(moe.num_experts, width, d), requires_grad=False)
        self.o_experts = nn.Parameter(torch.empty(moe.num_experts, d, width), requires_grad=False)
        self.o_bias = nn.Parameter(torch.empty(d), requires_grad=False)
        self.kv_proj = nn.Linear(d, 2 * width, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        t, (experts, width, _) = x.shape[0], self.q_experts.shape
        ids, weights = route(self.router(x), self.k, x.dtype)
        # Every expert's queries (experts / k times the work of the chosen ones, in one matmul), then the chosen
        queries = (x @ self.q_experts.reshape(experts * width, -1).t()).view(t, experts, width)
        q = queries.gather(1, ids[..., None].expand(-1, -1, width)).view(t, self.k * self.kv, self.head_dim)
        k, v = self.kv_proj(x).view(t, 2 * self.kv, self.head_dim).chunk(2, dim=1)
        q = apply_rotary(q, meta.cos, meta.sin, False, meta.rope_cache)
        k = apply_rotary(k.contiguous(), meta.cos, meta.sin, False, meta.rope_cache)
        # slot-major heads (slot s, K/V head j) -> head-major, so the pool's grouping pairs head j with K/V head j
        q = q.view(t, self.k, self.kv, self.head_dim).transpose(1, 2).reshape(t, -1, self.head_dim)
        out = paged_attention(q, k, v.contiguous(), meta, self.layer_idx, self.scale)
        out = out.view(t, self.kv, self.k, self.head_dim).transpose(1, 2).reshape(t, self.k, width)
        y = torch.zeros(t, x.shape[1], dtype=x.dtype, device=x.device)
        for e in range(experts):  # each slot's output through its expert's W_o, weighted
            rows, slots = (ids == e).nonzero(as_tuple=True)
            if rows.numel():
                y.index_add_(0, rows, (out[rows, slots] @ self.o_experts[e].t()) * weights[rows, slots, None])
        return y + self.o_bias


class BiasedMoE(SparseMoE):
    """The routed experts (a softmax over the k chosen logits) plus the layer's bias."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__(cfg, tp, softmax_after_topk=True)
        self.bias = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.bias


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = MixtureOfAttention(cfg, layer_idx)
        self.mlp = BiasedMoE(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, 1e-6)  # (JetMoeRMSNorm's default in the layers)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, 1e-6)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, meta), residual)
        return self.mlp(h), residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    # (runner: no CUDA-graph capture) the output projection loops over the experts a step chose
    eager_decode = "JetMoE's attention experts are applied expert by expert, as the step's routing chose them"
