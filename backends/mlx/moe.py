"""Sparse mixture-of-experts MLP for MLX: Mixtral, Qwen2-MoE (shared expert), Qwen3-MoE, and
gpt-oss through SparseMoE's options (router and expert biases, softmax over the top-k logits,
clamped SwiGLU; MXFP4 experts).

Experts are stored stacked, [E, out, in] per projection, and computed with mx.gather_mm (float)
or mx.gather_qmm (quantized, the codes never dequantized): each token's rows meet only its k
experts' matrices, with no per-expert or per-token Python loop. For larger batches the
(token, expert) pairs are sorted by expert first, so each expert's matrix is read once per
contiguous run of its tokens (`sorted_indices`). Routing maths: app/models/family_moe.py.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, MLP

# Below this many (token, expert) pairs the sort costs more than it saves (decode steps).
SORT_MIN_PAIRS = 64


def _add_bias(y: mx.array, module: nn.Module, indices: mx.array) -> mx.array:
    """y [..., 1, out] plus each row's expert bias [E, out] (gpt-oss), where the module has one."""
    bias = module.get("bias")
    return y if bias is None else y + bias[indices][..., None, :]


class ExpertLinear(nn.Module):
    """E float matrices [E, out, in]; y = x @ W[e].T (+ b[e] with bias) for each row's expert e."""

    def __init__(self, num_experts: int, in_dims: int, out_dims: int, bias: bool = False):
        super().__init__()
        self.weight = mx.zeros((num_experts, out_dims, in_dims))
        if bias:
            self.bias = mx.zeros((num_experts, out_dims))

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
        w = self.weight.swapaxes(-1, -2)
        if x.dtype != mx.float32 and mx.default_device().type != mx.DeviceType.gpu:
            # MLX's CPU gather_mm takes float32 only: half-precision experts are widened for the
            # product (exact) and the result rounded to the model dtype once.
            y = mx.gather_mm(
                x.astype(mx.float32), w.astype(mx.float32), rhs_indices=indices, sorted_indices=sorted_indices
            )
            y = y.astype(x.dtype)
        else:
            y = mx.gather_mm(x, w, rhs_indices=indices, sorted_indices=sorted_indices)
        return _add_bias(y, self, indices)


class QuantExpertLinear(nn.Module):
    """E quantized matrices in MLX's layout: weight uint32 [E, out, in * bits / 32], scales
    [E, out, in / group_size], and for mode "affine" biases (zero points) of the scales' shape.
    mode "mxfp4" (gpt-oss): 4-bit e2m1 codes, uint8 e8m0 scales per 32, no zero points. bias: an
    additive bias [E, out] per expert (gpt-oss), unrelated to the affine `biases`. global_scale: one
    float per expert multiplying its output (compressed-tensors' / ModelOpt's NVFP4)."""

    def __init__(
        self,
        num_experts: int,
        in_dims: int,
        out_dims: int,
        bits: int,
        group_size: int,
        mode: str = "affine",
        bias: bool = False,
        global_scale: bool = False,
    ):
        super().__init__()
        self.bits, self.group_size, self.mode = bits, group_size, mode
        self.weight = mx.zeros((num_experts, out_dims, in_dims * bits // 32), dtype=mx.uint32)
        if mode == "affine":
            self.scales = mx.zeros((num_experts, out_dims, in_dims // group_size))
            self.biases = mx.zeros((num_experts, out_dims, in_dims // group_size))
        else:
            self.scales = mx.zeros((num_experts, out_dims, in_dims // group_size), dtype=mx.uint8)
        if bias:
            self.bias = mx.zeros((num_experts, out_dims))
        if global_scale:  # NVFP4 exports: one float per expert matrix, applied to its output (float32)
            self.global_scale = mx.ones((num_experts,), dtype=mx.float32)
        self.freeze()

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
        scaled = "global_scale" in self
        y = mx.gather_qmm(
            x.astype(mx.float32) if scaled and x.dtype == mx.float16 else x,  # unscaled products overflow fp16
            self.weight,
            self.scales,
            self.get("biases"),
            rhs_indices=indices,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
            sorted_indices=sorted_indices,
        )
        if scaled:
            y = (y.astype(mx.float32) * self.global_scale[indices][..., None, None]).astype(x.dtype)
        return _add_bias(y, self, indices)


class Experts(nn.Module):
    """The routed experts' gated MLPs, stacked: gate_proj / up_proj [E, I, H], down_proj [E, H, I]; ungated
    experts (MoEConfig.gated false, Nemotron 3) have no gate_proj and compute down(act(up(x))). H is the
    MoE's latent_size where it has one.

    bias: each projection adds a per-expert bias; glu: how gate and up combine (default
    act(gate) * up)."""

    def __init__(
        self, cfg: ModelConfig, bias: bool = False, glu: Callable[[mx.array, mx.array], mx.array] | None = None
    ):
        super().__init__()
        moe = cfg.moe
        e, d, inner = moe.num_experts, moe.latent_size or cfg.hidden_size, moe.intermediate_size
        act = ACTIVATIONS[cfg.hidden_act]
        self.act, self.gated = act, moe.gated
        self.glu = glu or (lambda gate, up: act(gate) * up)
        if moe.gated:
            self.gate_proj = ExpertLinear(e, d, inner, bias)
        self.up_proj = ExpertLinear(e, d, inner, bias)
        self.down_proj = ExpertLinear(e, inner, d, bias)

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
        up = self.up_proj(xs, ids, sort)
        h = self.glu(self.gate_proj(xs, ids, sort), up) if self.gated else self.act(up)
        y = self.down_proj(h, ids, sort)
        if sort:
            return y[inverse].reshape(t, k, -1)
        return y.squeeze(-2)


def clamped_swiglu(alpha: float, limit: float) -> Callable[[mx.array, mx.array], mx.array]:
    """gpt-oss's expert activation: gate clamped above at limit, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate)."""

    def glu(gate: mx.array, up: mx.array) -> mx.array:
        gate = mx.minimum(gate, limit)
        up = mx.clip(up, -limit, limit)
        return (up + 1) * (gate * mx.sigmoid(gate * alpha))

    return glu


def sparsemixer(logits: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    """PhiMoE's SparseMixer at inference (transformers' sparsemixer, eval mode): (expert ids [T, 2], weights [T, 2]).
    Expert one is the best logit, weighted by the softmax over the logits within 2 eps (relative to
    max(|logit|, best)) of it; expert two the best of the others, weighted by the softmax of the others within
    that margin of it; in the logits' dtype, not renormalised."""
    ids, weights = [], []
    scores = logits
    for _ in range(2):
        idx = mx.argmax(scores, axis=-1, keepdims=True)
        best = mx.take_along_axis(scores, idx, axis=-1)
        margin = (best - logits) / mx.maximum(mx.abs(logits), best) > 2 * eps
        gates = mx.softmax(mx.where(margin, -mx.inf, scores), axis=-1, precise=True)
        weights.append(mx.take_along_axis(gates, idx, axis=-1))
        ids.append(idx)
        scores = mx.put_along_axis(scores, idx, mx.array(-mx.inf, dtype=scores.dtype), axis=-1)
    return mx.concatenate(ids, axis=-1), mx.concatenate(weights, axis=-1)


class SparseMoE(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        router_bias: bool = False,
        expert_bias: bool = False,
        glu: Callable[[mx.array, mx.array], mx.array] | None = None,
        softmax_after_topk: bool = False,
    ):
        """Options (gpt-oss; the defaults are the Mixtral / Qwen routers): router_bias: the router
        has a bias; expert_bias: every expert projection has one; glu: Experts' gate/up combination;
        softmax_after_topk: weights are a softmax over the k chosen logits, in the model dtype."""
        super().__init__()
        moe = cfg.moe
        self.top_k, self.norm_topk_prob, self.fp32_weights = moe.top_k, moe.norm_topk_prob, moe.router_weights_fp32
        self.softmax_after_topk = softmax_after_topk
        self.sparsemixer_eps = moe.sparsemixer_eps
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=router_bias)  # the router
        self.experts = Experts(cfg, expert_bias, glu)
        if moe.shared_expert_size:
            self.shared_expert = MLP(cfg, moe.shared_expert_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """(expert indices [T, k], their weights [T, k]): softmax over all experts in float32,
        top-k, renormalised when the config says so (transformers' routers); or top-k of the
        logits, then their softmax (gpt-oss)."""
        k = self.top_k
        if self.sparsemixer_eps is not None:
            return sparsemixer(self.gate(x), self.sparsemixer_eps)
        if self.softmax_after_topk:
            logits = self.gate(x)
            indices = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
            return indices, mx.softmax(mx.take_along_axis(logits, indices, axis=-1), axis=-1, precise=True)
        probs = mx.softmax(self.gate(x).astype(mx.float32), axis=-1)
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
