"""Plain-torch references of the Triton kernels. They are also the CPU path of the torch backend.

A negative slot in a slot mapping means "write nothing" (padding rows of a CUDA-graph batch).

Shapes: pools [num_slots, kv_heads, head_dim] (slot = block * block_size + offset);
block_tables [B, max_blocks] int; lengths [B] int.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    k_pool.index_copy_(0, slots, k.to(k_pool.dtype))
    v_pool.index_copy_(0, slots, v.to(v_pool.dtype))


def context_slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """[B, length] pool slots of each sequence's first `length` tokens."""
    j = torch.arange(length, device=block_tables.device)
    return block_tables[:, j // block_size].long() * block_size + j % block_size


def sdpa_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """q [B, H, L, D], k/v [B, KVH, S, D] (grouped-query heads); mask [.., L, S] bool, True = attend."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] -> [B, H, D].

    Gathers whole blocks (contiguous copies) and keeps grouped-query heads grouped, two batched
    matmuls rather than SDPA over repeated K/V: on a CPU this is ~2x faster at 32 sequences."""
    b, h, d = q.shape
    kvh = k_pool.shape[1]
    n_blocks = -(-int(seq_lens.max()) // block_size)
    tables = block_tables[:, :n_blocks].long()
    span = n_blocks * block_size
    k = k_pool.view(-1, block_size, kvh, d)[tables].view(b, span, kvh, d).to(q.dtype)
    v = v_pool.view(-1, block_size, kvh, d)[tables].view(b, span, kvh, d).to(q.dtype)
    qg = q.view(b, kvh, h // kvh, d)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * scale  # [B, KVH, G, S]
    past_end = torch.arange(span, device=q.device)[None, :] >= seq_lens[:, None]
    scores.masked_fill_(past_end[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v.transpose(1, 2)).view(b, h, d)  # [B, KVH, G, D] -> [B, H, D]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [L, H, D] are the last L of the S keys k/v [S, KVH, D] (bottom-right causal) -> [L, H, D]."""
    n_q, n_k = q.shape[0], k.shape[0]
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
    out = sdpa_grouped(
        q.transpose(0, 1)[None], k.to(q.dtype).transpose(0, 1)[None], v.to(q.dtype).transpose(0, 1)[None], scale, mask
    )
    return out[0].transpose(0, 1)


def paged_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    ctx_len: int,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """A prefill chunk q [L, H, D] (its K/V already in the pool) against its whole context."""
    slots = context_slots(block_table[None], ctx_len, block_size)[0]
    return causal_attention(q, k_pool[slots], v_pool[slots], scale)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x, or of x + residual when one is given; returns (normed, the sum as new residual).

    Rounding follows HF Llama: the sum in the model dtype, the norm in float32, weight applied in
    the model dtype."""
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF rotate_half layout: x [T, H, D]; cos/sin [T, D] at each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]).to(x.dtype)
