"""Triton kernels: KV-cache write through slot mapping, split-K paged decode, paged prefill.

Each matches a function of kernels/reference.py (tests run both with TRITON_INTERPRET=1 on CPU).
Decode scores use broadcast products (a query group of 1-8 heads is too small for tl.dot); prefill
uses tl.dot on 16-query x 32-key tiles. Online-softmax accumulation is in float32.

Sliding windows (query p sees keys p - window < j <= p) are a runtime argument: one compiled kernel
serves every layer, and loops start at the window's first block. Soft-caps and sinks are constexpr
switches: models without them pay nothing.

Split-K decode folds its splits inside the partial kernel: the last program of each (sequence, KV head) to finish,
told by an atomic count, combines the splits' partial softmaxes (as split-K GEMMs do with a semaphore), so a decode
layer launches one attention kernel, not two -- at batch 1 on a GPU each launch costs about what the kernel does.
The counts live in one zeroed buffer per device that every call leaves at zero; the kernels that use it run one at a
time on a device (Lantern runs a model's steps on one stream; a second stream running decode at the same moment
would need counts of its own).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lantern.backends.paged_plan import window_blocks
from lantern.backends.torch.kernels import pdl

NO_WINDOW = 1 << 30  # the window argument when a layer attends to its whole context


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    kp_ptr,
    vp_ptr,
    slot_ptr,
    stride_t,
    stride_h,
    stride_s,
    stride_sh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = (d < HEAD_DIM) & (slot >= 0)
    src = t * stride_t + h * stride_h + d
    dst = slot * stride_s + h * stride_sh + d
    tl.store(kp_ptr + dst, tl.load(k_ptr + src, mask=m), mask=m)
    tl.store(vp_ptr + dst, tl.load(v_ptr + src, mask=m), mask=m)


def write_kv(k_pool, v_pool, k, v, slots) -> None:
    t, kvh, d = k.shape
    k, v = k.to(k_pool.dtype).contiguous(), v.to(v_pool.dtype).contiguous()
    _write_kv_kernel[(t, kvh)](
        k,
        v,
        k_pool,
        v_pool,
        slots,
        k.stride(0),
        k.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
    )


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # tanh from exp (interpreter and GPUs alike); never overflows
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _online_softmax_step(q, k, v, allowed, m_i, l_i, acc, scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """Fold one tile of keys into the running (max, sum, weighted values) of each query row.

    q [M, D], k/v [N, D], allowed [M, N]; rows with nothing allowed yet keep m = -inf safely."""
    s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
    if HAS_SOFTCAP:
        s = softcap * _tanh(s / softcap)  # before masking, as Gemma 2
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return m_new, l_i, acc


@triton.jit
def _decode_partial_kernel(
    q_ptr,
    kp_ptr,
    vp_ptr,
    bt_ptr,
    len_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    count_ptr,  # FOLD: int32 [B, KVH], zero between calls
    sinks_ptr,  # FOLD and HAS_SINKS
    out_ptr,  # FOLD
    scale,
    window,
    softcap,
    stride_qb,
    stride_qh,
    stride_s,
    stride_sh,
    stride_bt,
    stride_ob,
    stride_oh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    FOLD: tl.constexpr,  # the last program of each (sequence, KV head) folds the splits: no reduce kernel
    HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.launch)
):
    if PDL:  # (kernels/pdl.py: wait for the kernel before, then let the next one launch)
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(len_ptr + b)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, BLOCK_D)
    gm, dm = g < GROUP, d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0
    ).to(tl.float32)
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, BLOCK_D], tl.float32)
    offs = tl.arange(0, BLOCK_SIZE)
    # Each sequence shares the blocks its window reaches out over the NUM_SPLITS programs, so the
    # grid does not depend on the context length (a CUDA graph fixes it) and long contexts still
    # spread out. The query sits at seq_len - 1: it sees keys from seq_len - window on.
    lo = tl.maximum(seq_len - window, 0)
    first_blk = lo // BLOCK_SIZE
    n_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    per_split = tl.cdiv(n_blocks - first_blk, NUM_SPLITS)
    first = first_blk + split * per_split
    last = tl.minimum(first + per_split, n_blocks)  # empty splits report m = -inf: zero weight
    for blk in range(first, last):
        tok = blk * BLOCK_SIZE + offs
        valid = (tok < seq_len) & (tok >= lo)
        phys = tl.load(bt_ptr + b * stride_bt + blk).to(tl.int64)
        rows = (phys * BLOCK_SIZE + offs)[:, None] * stride_s + kvh * stride_sh + d[None, :]
        km = valid[:, None] & dm[None, :]
        k = tl.load(kp_ptr + rows, mask=km, other=0.0).to(tl.float32)
        v = tl.load(vp_ptr + rows, mask=km, other=0.0).to(tl.float32)
        m_i, l_i, acc = _online_softmax_step(q, k, v, valid[None, :], m_i, l_i, acc, scale, softcap, HAS_SOFTCAP)
    base = (b * NUM_HEADS + heads) * NUM_SPLITS + split
    tl.store(acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=gm[:, None] & dm[None, :])
    tl.store(m_ptr + base, m_i, mask=gm)
    tl.store(l_ptr + base, l_i, mask=gm)
    if FOLD:
        # Stores above, then the count (release); the program that brings it to NUM_SPLITS sees every split's
        # (acquire), folds them and sets the count back to zero for the next call (a CUDA graph's next replay).
        counter = count_ptr + b * tl.num_programs(1) + kvh
        tl.debug_barrier()  # every thread's stores before the count (Triton puts one there today; not by contract)
        if tl.atomic_add(counter, 1, sem="acq_rel") == NUM_SPLITS - 1:
            _fold_splits(acc_ptr, m_ptr, l_ptr, sinks_ptr, out_ptr + b * stride_ob, stride_oh, b, heads, gm, d, dm,
                         NUM_HEADS, NUM_SPLITS, HEAD_DIM, HAS_SINKS)  # fmt: skip
            tl.store(counter, 0)


@triton.jit
def _fold_splits(
    acc_ptr,
    m_ptr,
    l_ptr,
    sinks_ptr,
    row_ptr,
    stride_oh,
    b,
    heads,
    gm,
    d,
    dm,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """_decode_reduce_kernel's sums for one program's heads, a split at a time (registers: [heads, D]); read
    through L2 (.cg): the other programs' partials were written from other SMs."""
    first = (b * NUM_HEADS + heads) * NUM_SPLITS
    m_max = tl.full(heads.shape, float("-inf"), tl.float32)
    for sp in range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(m_ptr + first + sp, mask=gm, other=float("-inf"), cache_modifier=".cg"))
    if HAS_SINKS:  # the head's sink logit joins the denominator once, with no value (gpt-oss)
        sink = tl.load(sinks_ptr + heads, mask=gm, other=0.0).to(tl.float32)
        m_max = tl.maximum(m_max, sink)
    denom = tl.zeros(heads.shape, tl.float32)
    out = tl.zeros((heads.shape[0], d.shape[0]), tl.float32)
    for sp in range(NUM_SPLITS):
        m = tl.load(m_ptr + first + sp, mask=gm, other=float("-inf"), cache_modifier=".cg")
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
        denom += tl.load(l_ptr + first + sp, mask=gm, other=0.0, cache_modifier=".cg") * w
        rows = (first + sp)[:, None] * HEAD_DIM + d[None, :]
        part = tl.load(acc_ptr + rows, mask=gm[:, None] & dm[None, :], other=0.0, cache_modifier=".cg")
        out += part * w[:, None]
    if HAS_SINKS:
        denom += tl.exp(sink - m_max)
    out = out / tl.where(gm, denom, 1.0)[:, None]
    tl.store(row_ptr + heads[:, None] * stride_oh + d[None, :], out.to(row_ptr.dtype.element_ty),
             mask=gm[:, None] & dm[None, :])  # fmt: skip


@triton.jit
def _decode_reduce_kernel(
    acc_ptr,
    m_ptr,
    l_ptr,
    sinks_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_P)
    d = tl.arange(0, BLOCK_D)
    sm, dm = sp < NUM_SPLITS, d < HEAD_DIM
    base = (b * NUM_HEADS + h) * NUM_SPLITS + sp
    m = tl.load(m_ptr + base, mask=sm, other=float("-inf"))
    l = tl.load(l_ptr + base, mask=sm, other=0.0)
    acc = tl.load(acc_ptr + base[:, None] * HEAD_DIM + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    m_max = tl.max(m, axis=0)
    if HAS_SINKS:  # the head's sink logit joins the denominator once, with no value (gpt-oss)
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_max = tl.maximum(m_max, sink)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
    denom = tl.sum(l * w, axis=0)
    if HAS_SINKS:
        denom += tl.exp(sink - m_max)
    out = tl.sum(acc * w[:, None], axis=0) / denom
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=dm)


def decode_splits(batch: int, kv_heads: int, max_blocks: int) -> int:
    """Programs per (sequence, KV head): enough to fill a GPU (~256 programs) at small batch."""
    want = triton.next_power_of_2(triton.cdiv(256, batch * kv_heads))
    return max(1, min(32, want, max_blocks))


_COUNTERS_MIN = 1 << 16  # (sequence, KV head) pairs a device's counters cover: 512 sequences x 128 KV heads
_counters: dict[torch.device, torch.Tensor] = {}


def fold_counters(device: torch.device, pairs: int) -> torch.Tensor | None:
    """The device's zeroed int32 counters for the partial kernel's fold (FOLD): one per (sequence, KV head), made
    once, outside any CUDA graph capture (a graph replays with their address), and left at zero by every call.
    None where none can be made now (inside a capture) or there are too few: the reduce kernel then serves."""
    held = _counters.get(device)
    if held is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        held = _counters[device] = torch.zeros(_COUNTERS_MIN, dtype=torch.int32, device=device)
    return held if pairs <= held.numel() else None


def paged_decode(
    q,
    k_pool,
    v_pool,
    block_tables,
    seq_lens,
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    num_splits: int | None = None,
    fold: bool = True,
):
    """Matches reference.paged_decode; block_tables must hold no negative (released) entries. fold: the partial
    kernel folds its splits itself (one kernel, no reduce launch) where the device's counters allow (fold_counters)."""
    b, h, d = q.shape
    kvh = k_pool.shape[1]
    group = h // kvh
    reach = block_tables.shape[1] if window is None else min(block_tables.shape[1], window_blocks(window, block_size))
    splits = num_splits or decode_splits(b, kvh, reach)  # split only the blocks the window reaches
    q = q.contiguous()
    block_tables = block_tables.contiguous()
    acc = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)
    m = torch.empty((b, h, splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    out = torch.empty_like(q)
    sinks_f = m if sinks is None else sinks.float().contiguous()  # (unread without sinks)
    counters = fold_counters(q.device, b * kvh) if fold else None
    block_d = triton.next_power_of_2(d)
    _decode_partial_kernel[(b, kvh, splits)](
        q, k_pool, v_pool, block_tables, seq_lens, acc, m, l, m if counters is None else counters, sinks_f, out,
        scale, NO_WINDOW if window is None else window, float(softcap or 0.0),
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), block_tables.stride(0), out.stride(0),
        out.stride(1), BLOCK_SIZE=block_size, HEAD_DIM=d, BLOCK_D=block_d, GROUP=group,
        GROUP_P=triton.next_power_of_2(group), NUM_SPLITS=splits, NUM_HEADS=h, HAS_SOFTCAP=softcap is not None,
        FOLD=counters is not None, HAS_SINKS=sinks is not None, **pdl.launch(q),
    )  # fmt: skip
    if counters is not None:
        return out
    _decode_reduce_kernel[(b, h)](
        acc, m, l, sinks_f, out, out.stride(0), out.stride(1), NUM_HEADS=h, NUM_SPLITS=splits,
        SPLITS_P=triton.next_power_of_2(splits), HEAD_DIM=d, BLOCK_D=block_d, HAS_SINKS=sinks is not None,
    )  # fmt: skip
    return out


@triton.jit
def _prefill_kernel(
    q_ptr,
    kp_ptr,
    vp_ptr,
    bt_ptr,
    out_ptr,
    sinks_ptr,
    q_len,
    ctx_len,
    scale,
    window,
    softcap,
    stride_qt,
    stride_qh,
    stride_s,
    stride_sh,
    stride_ot,
    stride_oh,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Flash-attention over a chunk's queries (BLOCK_M rows) and its whole paged context.

    Key tiles of BLOCK_N tokens find their pool rows token by token through the block table, so
    the tile size (what tl.dot needs, >= 16) does not depend on the KV block size."""
    h = tl.program_id(0)
    qb = tl.program_id(1)
    kvh = h // GROUP
    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    mm, dm = offs_m < q_len, d < HEAD_DIM
    q = tl.load(
        q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + d[None, :], mask=mm[:, None] & dm[None, :], other=0.0
    )
    pos_q = ctx_len - q_len + offs_m
    if HAS_SINKS:  # start from the sink logit: weight exp(sink), no value (gpt-oss)
        m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(sinks_ptr + h).to(tl.float32)
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    # Only keys between this query block's first window start and its last position can be seen.
    first = tl.maximum(ctx_len - q_len + qb * BLOCK_M - window + 1, 0)
    last = tl.minimum(ctx_len, ctx_len - q_len + (qb + 1) * BLOCK_M)
    for start in range(first, last, BLOCK_N):
        tok = start + offs_n
        tm = tok < ctx_len
        phys = tl.load(bt_ptr + tok // BLOCK_SIZE, mask=tm, other=0).to(tl.int64)
        rows = (phys * BLOCK_SIZE + tok % BLOCK_SIZE)[:, None] * stride_s + kvh * stride_sh + d[None, :]
        km = tm[:, None] & dm[None, :]
        k = tl.load(kp_ptr + rows, mask=km, other=0.0).to(q.dtype)
        v = tl.load(vp_ptr + rows, mask=km, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if HAS_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        seen = (tok[None, :] <= pos_q[:, None]) & (tok[None, :] > pos_q[:, None] - window)
        s = tl.where(seen & tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + offs_m[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mm[:, None] & dm[None, :],
    )


def paged_prefill(
    q,
    k_pool,
    v_pool,
    block_table,
    ctx_len: int,
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    block_m: int = 16,
    block_n: int = 32,
):
    """Matches reference.paged_prefill; block_table must hold no negative (released) entries."""
    n, h, d = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    _prefill_kernel[(h, triton.cdiv(n, block_m))](
        q,
        k_pool,
        v_pool,
        block_table.contiguous(),
        out,
        q if sinks is None else sinks.float().contiguous(),  # unread without sinks
        n,
        ctx_len,
        scale,
        NO_WINDOW if window is None else window,
        float(softcap or 0.0),
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        GROUP=h // k_pool.shape[1],
        # float32 stays exact (no TF32 rounding); half types use the tensor cores' native inputs.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
    )
    return out
