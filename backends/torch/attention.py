"""Paged KV pool and paged attention in plain torch: the CPU path and the reference for kernels.

Layout matches the MLX backend: per layer one pool [num_blocks * block_size, kv_heads, head_dim]
for K and one for V; writes go to `slot_mapping`, reads gather context slots from the shared
numpy plan (backends/paged_plan.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from app.engine.batch import ScheduledBatch
from backends.paged_plan import AttentionPlan


class TorchKVPool:
    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_slots, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k.to(self.k[layer].dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v[layer].dtype))

    def copy_blocks(self, pairs: list[tuple[int, int]], block_size: int) -> None:
        device = self.k[0].device
        src = torch.cat([torch.arange(s * block_size, (s + 1) * block_size) for s, _ in pairs]).to(device)
        dst = torch.cat([torch.arange(d * block_size, (d + 1) * block_size) for _, d in pairs]).to(device)
        for pool in self.k + self.v:
            pool[dst] = pool[src]


@dataclass
class PrefillGroup:
    q_start: int
    q_end: int
    context_slots: torch.Tensor | None


@dataclass
class TorchAttentionMetadata:
    pool: TorchKVPool
    slot_mapping: torch.Tensor  # [T] int64
    cos: torch.Tensor  # [T, D] at each token's position
    sin: torch.Tensor
    decode_token_idx: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None  # [B, L]
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, L] bool
    prefills: list[PrefillGroup] = field(default_factory=list)
    restore_order: torch.Tensor | None = None


def build_metadata(pool: TorchKVPool, batch: ScheduledBatch, plan: AttentionPlan,
                   cos_table: torch.Tensor, sin_table: torch.Tensor) -> TorchAttentionMetadata:
    dev = cos_table.device
    as_t = lambda a: torch.from_numpy(a).to(dev, torch.long)  # noqa: E731
    positions = as_t(batch.positions)
    meta = TorchAttentionMetadata(pool, as_t(batch.slot_mapping), cos_table[positions], sin_table[positions])
    if plan.decode_token_idx is not None:
        meta.decode_token_idx = as_t(plan.decode_token_idx)
        meta.decode_slots = as_t(plan.decode_slots)
        meta.decode_mask = torch.from_numpy(plan.decode_valid).to(dev)[:, None, None, :]
    for g in plan.prefills:
        slots = None if g.context_slots is None else as_t(g.context_slots)
        meta.prefills.append(PrefillGroup(g.q_start, g.q_end, slots))
    if plan.restore_order is not None:
        meta.restore_order = as_t(plan.restore_order)
    return meta


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """q [B, H, L, D], k/v [B, KVH, S, D] with grouped heads; mask [.., L, S] bool (True = attend)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: TorchAttentionMetadata,
                    layer: int, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D] for this step's tokens -> attention output [T, H, D]."""
    pool = meta.pool
    pool.write(layer, meta.slot_mapping, k, v)
    k_pool, v_pool = pool.k[layer], pool.v[layer]
    pieces = []
    if meta.decode_token_idx is not None:
        qd = q[meta.decode_token_idx][:, :, None, :]
        kd = k_pool[meta.decode_slots].transpose(1, 2).to(q.dtype)
        vd = v_pool[meta.decode_slots].transpose(1, 2).to(q.dtype)
        pieces.append(_sdpa(qd, kd, vd, scale, meta.decode_mask)[:, :, 0, :])
    for g in meta.prefills:
        qp = q[g.q_start : g.q_end].transpose(0, 1)[None]
        if g.context_slots is None:
            kp, vp = k[g.q_start : g.q_end], v[g.q_start : g.q_end]
        else:
            kp, vp = k_pool[g.context_slots], v_pool[g.context_slots]
        kp = kp.to(q.dtype).transpose(0, 1)[None]
        vp = vp.to(q.dtype).transpose(0, 1)[None]
        n_q, n_k = qp.shape[2], kp.shape[2]
        # Bottom-right causal: query i (of the last n_q) sees keys up to n_k - n_q + i.
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        pieces.append(_sdpa(qp, kp, vp, scale, mask)[0].transpose(0, 1))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
    if meta.restore_order is not None:
        out = out[meta.restore_order]
    return out
