"""Plain-torch references of the Triton kernels. They are also the CPU path of the torch backend.

A negative slot in a slot mapping means "write nothing" (padding rows of a CUDA-graph batch).
Attention takes a sliding `window` (query p sees keys p - window < j <= p), a logit `softcap`,
per-head `sinks` and ALiBi's per-head `alibi` slopes (slope * key position added to the scaled scores:
softmax cancels the query's own term, as BLOOM computes it), as transformers computes them (Mistral /
Gemma 2 / gpt-oss / BLOOM eager attention).

Shapes: pools [num_slots, kv_heads, head_dim] (slot = block * block_size + offset);
block_tables [B, max_blocks] int; lengths [B] int. V may be narrower than K (multi-head latent
attention: the V pool is a view of K's first columns); outputs then have V's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lantern.backends.paged_plan import window_blocks


def write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor | None,
    slots: torch.Tensor,
    may_skip: bool = True,
) -> None:
    """v_pool and v None: V lies inside K (multi-head latent attention), only K is written.
    may_skip=False: the caller knows no slot is negative (saves a host sync per layer)."""
    keep = slots >= 0 if may_skip else None
    if keep is not None and not bool(keep.all()):
        slots, k = slots[keep], k[keep]
        v = None if v is None else v[keep]
    k_pool.index_copy_(0, slots, _as(k, k_pool.dtype))
    if v_pool is not None:
        v_pool.index_copy_(0, slots, _as(v, v_pool.dtype))


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x.to(dtype) without the call when it would be a no-op: a decode step makes ~4 per layer,
    ~2 us each on a CPU."""
    return x if x.dtype == dtype else x.to(dtype)


def _v_inside_k(k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    """True when the V pool is a view of K's first columns (multi-head latent attention). Widths are
    compared first: the usual pools need no pointer read, which a compiled graph cannot do."""
    return v_pool.shape[-1] < k_pool.shape[-1] and v_pool.data_ptr() == k_pool.data_ptr()


def context_slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """[B, length] pool slots of each sequence's first `length` tokens."""
    j = torch.arange(length, device=block_tables.device)
    return block_tables[:, j // block_size].long() * block_size + j % block_size


def sdpa_grouped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, L, D], k/v [B, KVH, S, D] (grouped-query heads); mask [.., L, S] bool, True = attend,
    or None for the plain causal mask of L == S (SDPA's is_causal: no mask is built, and torch's CPU
    flash kernel skips the blocks above the diagonal, ~2x faster at 2k tokens, bit-equal).

    softcap: scores (after scale) -> softcap * tanh(scores / softcap) before masking (Gemma 2);
    sinks [H]: an extra logit per head in the softmax's denominator only (gpt-oss). Either one
    needs the scores, so they take explicit matmuls in float32 (as does a V narrower than K, whose
    repeat per query head would cost more than the grouped matmuls); otherwise torch's SDPA, whose
    enable_gqa reads each KV head for its query heads in place (no repeated copy of K and V)."""
    if softcap is None and sinks is None and alibi is None and k.shape[-1] == v.shape[-1]:
        gqa = q.shape[1] != k.shape[1]
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if mask is None:
        mask = causal_mask(q.shape[2], k.shape[2], None, q.device)
    b, h, n_q, d = q.shape
    kvh = k.shape[1]
    qg = q.reshape(b, kvh, h // kvh, n_q, d)
    if alibi is None:
        scores = torch.matmul(qg, k[:, :, None].transpose(-1, -2)).float() * scale  # [B, KVH, G, L, S]
    else:  # (q scaled first: an unscaled fp16 product could overflow, as BLOOM's baddbmm never forms it)
        scores = torch.matmul(qg * scale, k[:, :, None].transpose(-1, -2)).float()
        scores = scores + alibi_bias(alibi, kvh, k.shape[2])  # keys from position 0 (ALiBi models have no window)
    probs = _softmax(scores, mask.reshape(-1, 1, 1, n_q, mask.shape[-1]), softcap, sinks)
    return torch.matmul(probs.to(v.dtype), v[:, :, None]).reshape(b, h, n_q, v.shape[-1])


def alibi_bias(slopes: torch.Tensor, kv_heads: int, keys: int) -> torch.Tensor:
    """[1, KVH, G, 1, S] float32: each query head's slope times the key positions 0 .. keys - 1."""
    pos = torch.arange(keys, device=slopes.device, dtype=torch.float32)
    return (slopes.float().view(kv_heads, -1)[:, :, None, None] * pos)[None]


def _softmax(
    scores: torch.Tensor, allowed: torch.Tensor, softcap: float | None, sinks: torch.Tensor | None
) -> torch.Tensor:
    """Softmax of float32 scores [B, KVH, G, L, S] over allowed keys, soft-capped, with sinks."""
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    kvh, g = scores.shape[1], scores.shape[2]
    sink = sinks.float().reshape(1, kvh, g, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


@dataclass
class DecodeContext:
    """Where one decode step's rows read their keys, for one window size: every layer with that
    window shares it, so it is computed once per step (attention.py caches it on the metadata).

    slots [B * span] int64 pool slots (row b's keys at b * span ..), allowed [B, span] bool."""

    slots: torch.Tensor
    allowed: torch.Tensor
    span: int
    biases: dict = field(default_factory=dict)  # dtype -> [B, 1, 1, span] 0 / -inf, SDPA's additive mask

    # Gather outputs, reused by every layer of the step; None: a fresh tensor per gather (a compiled
    # graph manages its own memory).
    buffers: dict | None = field(default_factory=dict)
    # One row whose blocks are consecutive in the pool (a lone sequence usually is): its keys are
    # the slots first_slot .. first_slot + span - 1, read in place instead of copied per layer.
    first_slot: int | None = None

    def gather(self, pool: torch.Tensor, which: str) -> torch.Tensor:
        """pool[slots] into a buffer the next layer reuses (a fresh multi-MB tensor per layer costs
        page faults: ~25% of the gather at 32 sequences), or a view of the pool (first_slot)."""
        if self.first_slot is not None:
            return pool.narrow(0, self.first_slot, self.span)
        if self.buffers is None:
            return pool.index_select(0, self.slots)
        key = (which, pool.dtype, tuple(pool.shape[1:]))
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = pool.new_empty((self.slots.numel(), *pool.shape[1:]))
        return torch.index_select(pool, 0, self.slots, out=buf)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """allowed as an additive mask (made once: SDPA would convert a bool mask in every layer)."""
        b = self.biases.get(dtype)
        if b is None:
            b = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            b = self.biases[dtype] = b.masked_fill_(~self.allowed, float("-inf"))[:, None, None, :]
        return b


def decode_context(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, window: int | None = None
) -> DecodeContext:
    """The keys each decode row reads: whole blocks from the one holding its window's first key
    (clamped so the columns stay inside the blocks the longest row uses); negative table entries
    must have been mapped to a real block (their positions lie before the window and are masked)."""
    n_blocks = -(-int(seq_lens.max()) // block_size)
    n = n_blocks if window is None else min(n_blocks, window_blocks(window, block_size))
    lens = seq_lens.long()
    dev = lens.device
    span = n * block_size
    offsets = torch.arange(span, device=dev)
    if window is None:  # every row starts at its first block
        allowed = offsets[None, :] < lens[:, None]
        cols = block_tables[:, :n].long()
    else:
        lo = (lens - window).clamp(min=0)
        first = torch.clamp(lo // block_size, max=n_blocks - n)
        key_pos = first[:, None] * block_size + offsets[None, :]
        allowed = (key_pos >= lo[:, None]) & (key_pos < lens[:, None])
        cols = block_tables.long().gather(1, first[:, None] + torch.arange(n, device=dev)[None, :])
    slots = (cols[:, :, None] * block_size + torch.arange(block_size, device=dev)).reshape(-1)
    ctx = DecodeContext(slots, allowed, span)
    if cols.shape[0] == 1 and (n == 1 or bool((cols[0, 1:] - cols[0, :-1] == 1).all())):
        ctx.first_slot = int(slots[0])  # (one host read per step, shared by every layer)
    return ctx


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    ctx: DecodeContext | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence (at position seq_len - 1): q [B, H, D] -> [B, H, D].

    ctx: this step's gather for `window` (decode_context), shared by the layers; made here when
    not given. Keys are gathered by slot (one index_select each for K and V) with grouped-query
    heads kept grouped; without soft-cap or sinks torch's SDPA does the rest: on a CPU ~4x faster
    than explicit matmuls and softmax at 1 and at 32 sequences."""
    b, h, d = q.shape
    kvh, dv = k_pool.shape[1], v_pool.shape[-1]
    if ctx is None:
        ctx = decode_context(block_tables, seq_lens, block_size, window)
    k = ctx.gather(k_pool, "k").view(b, ctx.span, kvh, d)
    if _v_inside_k(k_pool, v_pool):  # V is K's first columns: gathered already
        v = k[..., :dv]
    else:
        v = ctx.gather(v_pool, "v").view(b, ctx.span, kvh, dv)
    k, v = _as(k, q.dtype), _as(v, q.dtype)
    if softcap is None and sinks is None and alibi is None and dv == d:
        # The G query heads sharing a KV head are G query rows of one attention against it (they
        # share the mask row): no K/V repeat, and ~1.5x faster than SDPA's enable_gqa at 32 rows.
        out = F.scaled_dot_product_attention(
            q.view(b, kvh, h // kvh, d),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=ctx.bias(q.dtype),
            scale=scale,
        )
        return out.reshape(b, h, d)
    qg = q.view(b, kvh, h // kvh, 1, d)
    if alibi is None:
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)[:, :, None]).float() * scale  # [B, KVH, G, 1, S]
    else:  # (q scaled first, as above; no window: the gathered keys are positions 0 .. span - 1)
        scores = torch.matmul(qg * scale, k.permute(0, 2, 3, 1)[:, :, None]).float()
        scores = scores + alibi_bias(alibi, kvh, ctx.span)
    probs = _softmax(scores, ctx.allowed[:, None, None, None, :], softcap, sinks).to(q.dtype)
    return torch.matmul(probs, v.transpose(1, 2)[:, :, None]).reshape(b, h, dv)  # [B, KVH, G, 1, Dv] -> [B, H, Dv]


def causal_mask(n_q: int, n_k: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[n_q, n_k] bool: the queries are the last n_q of n_k positions; query p sees p - window < j <= p."""
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
    if window is not None:
        mask = mask.triu(n_k - n_q - window + 1)
    return mask


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [L, H, D] are the last L of the S keys k/v [S, KVH, D] (bottom-right causal) -> [L, H, D]."""
    n_q, n_k = q.shape[0], k.shape[0]
    if window is not None and n_k > n_q + window - 1:  # keys before the first query's window: drop
        k, v = k[n_k - (n_q + window - 1) :], v[n_k - (n_q + window - 1) :]
        n_k = k.shape[0]
    # A chunk that is its whole context, with no window cutting into it: the plain causal mask.
    plain = n_q == n_k and (window is None or n_k <= window)
    mask = None if plain else causal_mask(n_q, n_k, window, q.device)
    # On a CPU, bfloat16 operands in float32: torch's CPU flash kernel runs its bfloat16 path ~1.7x
    # slower at prompt lengths (~0.59 -> ~0.34 ms for 9 heads x 128 tokens on 2 EPYC cores). The values
    # widen exactly and the result is rounded once, so it is closer to the exact attention than the
    # bfloat16 path (which rounds the probabilities to bfloat16 before multiplying the values).
    dtype = torch.float32 if q.device.type == "cpu" and q.dtype == torch.bfloat16 else q.dtype
    out = sdpa_grouped(
        q.to(dtype).transpose(0, 1)[None],
        k.to(dtype).transpose(0, 1)[None],
        v.to(dtype).transpose(0, 1)[None],
        scale,
        mask,
        softcap,
        sinks,
        alibi,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def paged_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    ctx_len: int,
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """A prefill chunk q [L, H, D] (its K/V already in the pool) against its whole context.

    With a window only the keys from the first query's window on are gathered."""
    first = 0 if window is None else max(0, ctx_len - q.shape[0] - window + 1)
    slots = context_slots(block_table[None], ctx_len, block_size)[0, first:]
    k = k_pool[slots]
    if _v_inside_k(k_pool, v_pool):
        v = k[..., : v_pool.shape[-1]]
    else:
        v = v_pool[slots]
    return causal_attention(q, k, v, scale, window, softcap, sinks, alibi)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x, or of x + residual when one is given; returns (normed, the sum as new residual).

    Rounding follows HF Llama: the sum in the model dtype, the norm in float32, weight applied in
    the model dtype."""
    h = x if residual is None else x + residual
    if h.dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's rms_norm does the same float32 ops in the same order (bit-equal on a CPU, tested
        # in test_torch_decode_context) in one call from Python instead of six: a decode step is
        # bound by such calls on a CPU.
        return F.rms_norm(h, (h.shape[-1],), weight, eps), h
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF rotate_half layout: x [T, H, D]; cos/sin [T, D] at each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]).to(x.dtype)


def signed_rope(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, D] -> ([T, 1, D], [T, 1, D] with the first half of sin negated): the tables
    rotary_signed takes, made once per step and table."""
    half = sin.shape[-1] // 2
    return cos[:, None, :], torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)[:, None, :]


def rotary_signed(x: torch.Tensor, cos3: torch.Tensor, sin3: torch.Tensor) -> torch.Tensor:
    """rotary() in three ops, from signed_rope's tables: rotate_half(x) * sin is the halves of x
    swapped times the signed sin. (The CPU path: a decode step is bound by op count.)"""
    t, h, d = x.shape
    xf = x if x.dtype == torch.float32 else x.float()
    out = torch.addcmul(xf * cos3, xf.view(t, h, 2, d // 2).flip(-2).view(t, h, d), sin3)
    return out if out.dtype == x.dtype else out.to(x.dtype)
