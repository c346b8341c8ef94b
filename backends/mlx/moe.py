"""Sparse mixture-of-experts MLP for MLX: Mixtral, Qwen2-MoE (shared expert), Qwen3-MoE.

Experts are stored stacked, [E, out, in] per projection, and computed with mx.gather_mm (float)
or mx.gather_qmm (quantized, the codes never dequantized): each token's rows meet only its k
experts' matrices, with no per-expert or per-token Python loop. For larger batches the
(token, expert) pairs are sorted by expert first, so each expert's matrix is read once per
contiguous run of its tokens (`sorted_indices`). Routing maths: app/models/family_moe.py.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, MLP

# Below this many (token, expert) pairs the sort costs more than it saves (decode steps).
SORT_MIN_PAIRS = 64


class ExpertLinear(nn.Module):
    """E float matrices [E, out, in]; y = x @ W[e].T for each row's expert e."""

    def __init__(self, num_experts: int, in_dims: int, out_dims: int):
        super().__init__()
        self.weight = mx.zeros((num_experts, out_dims, in_dims))

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
        return mx.gather_mm(x, self.weight.swapaxes(-1, -2), rhs_indices=indices, sorted_indices=sorted_indices)


class QuantExpertLinear(nn.Module):
    """E affine-quantized matrices in MLX's layout: weight uint32 [E, out, in * bits / 32],
    scales and biases [E, out, in / group_size]."""

    def __init__(self, num_experts: int, in_dims: int, out_dims: int, bits: int, group_size: int):
        super().__init__()
        self.bits, self.group_size = bits, group_size
        self.weight = mx.zeros((num_experts, out_dims, in_dims * bits // 32), dtype=mx.uint32)
        self.scales = mx.zeros((num_experts, out_dims, in_dims // group_size))
        self.biases = mx.zeros((num_experts, out_dims, in_dims // group_size))
        self.freeze()

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
        return mx.gather_qmm(
            x,
            self.weight,
            self.scales,
            self.biases,
            rhs_indices=indices,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            sorted_indices=sorted_indices,
        )


class Experts(nn.Module):
    """The routed experts' gated MLPs, stacked: gate_proj / up_proj [E, I, H], down_proj [E, H, I]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e, d, inner = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = ExpertLinear(e, d, inner)
        self.up_proj = ExpertLinear(e, d, inner)
        self.down_proj = ExpertLinear(e, inner, d)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        """x [T, H], indices [T, k] -> each (token, expert) pair's output [T, k, H]."""
        t, k = indices.shape
        sort = indices.size >= SORT_MIN_PAIRS
        if sort:
            flat = indices.flatten()
            order = mx.argsort(flat)
            inverse = mx.argsort(order)
            xs = x[order // k][:, None, :]  # [T*k, 1, H], grouped by expert
            ids = flat[order]
        else:
            xs = x[:, None, None, :]  # [T, 1, 1, H]: broadcast against [T, k] indices
            ids = indices
        h = self.act(self.gate_proj(xs, ids, sort)) * self.up_proj(xs, ids, sort)
        y = self.down_proj(h, ids, sort)
        if sort:
            return y[inverse].reshape(t, k, -1)
        return y.squeeze(-2)


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe = cfg.moe
        self.top_k, self.norm_topk_prob, self.fp32_weights = moe.top_k, moe.norm_topk_prob, moe.router_weights_fp32
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)  # the router
        self.experts = Experts(cfg)
        if moe.shared_expert_size:
            self.shared_expert = MLP(cfg, moe.shared_expert_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """(expert indices [T, k], their weights [T, k]): softmax over all experts in float32,
        top-k, renormalised when the config says so (transformers' routers)."""
        probs = mx.softmax(self.gate(x).astype(mx.float32), axis=-1)
        k = self.top_k
        indices = mx.argpartition(-probs, kth=k - 1, axis=-1)[:, :k]
        weights = mx.take_along_axis(probs, indices, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return indices, weights

    def __call__(self, x: mx.array) -> mx.array:
        indices, weights = self.route(x)
        y = self.experts(x, indices)
        if self.fp32_weights:  # Mixtral: each expert's share in float32, then the model dtype
            out = (y * weights[..., None]).astype(x.dtype).sum(axis=1)
        else:
            out = (y * weights.astype(x.dtype)[..., None]).sum(axis=1)
        if "shared_expert" in self:
            out = out + mx.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
