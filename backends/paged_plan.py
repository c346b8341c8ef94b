"""Backend-neutral attention plan for one ScheduledBatch, in numpy.

Both backends attend the same way: single-token queries (decodes) in one padded batch that
gathers each sequence's context block by block, and each multi-token prefill chunk on its own
(reading its cached prefix back from the pool when there is one). This module computes the index
arrays once per step; each backend only converts them to its own arrays.

Block tables may hold -1: a block the engine released because it lies wholly before every
layer's sliding window. Gathers must never read it, so every table and slot array built here maps
-1 to block 0; the window mask (p - window < j <= p) hides those positions on every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lantern.app.engine.contract import ScheduledBatch


@dataclass
class PrefillPlan:
    q_start: int
    q_end: int
    context_slots: np.ndarray | None  # [ctx] int32; None: no cached prefix, use the chunk's own K/V
    block_table: np.ndarray  # [blocks] int32, released (-1) entries mapped to block 0
    ctx_len: int
    seq_index: int = -1  # which of the batch's sequences this chunk is

    @property
    def first_pos(self) -> int:
        """Position of the chunk's first query (the chunk is the last q_end - q_start tokens)."""
        return self.ctx_len - (self.q_end - self.q_start)


@dataclass
class AttentionPlan:
    decode_token_idx: np.ndarray | None = None  # [B] rows of the flattened batch
    decode_block_tables: np.ndarray | None = None  # [B, max_blocks] int32 (kernels read these)
    decode_seq_lens: np.ndarray | None = None  # [B] int32; each decode query sits at seq_len - 1
    decode_seqs: np.ndarray | None = None  # [B] which of the batch's sequences each decode row is
    prefills: list[PrefillPlan] = field(default_factory=list)
    restore_order: np.ndarray | None = None  # [T] int32; None when pieces are already in order
    logits_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # last token of sampled seqs


def _slots(table: np.ndarray, n: int, block_size: int) -> np.ndarray:
    j = np.arange(n)
    return (table[..., j // block_size] * block_size + j % block_size).astype(np.int32)


def window_blocks(window: int, block_size: int) -> int:
    """Most blocks a window of `window` keys can touch (it may start inside a block)."""
    return -(-(window - 1) // block_size) + 1


@dataclass
class DecodeWindow:
    """The decode batch restricted to the blocks one window can reach, for gathers that skip the rest."""

    block_tables: np.ndarray  # [B, n] int32: columns first_block[b] .. first_block[b] + n - 1
    key_pos: np.ndarray  # [B, n * block_size] int32: the position of each gathered key
    mask: np.ndarray  # [B, n * block_size] bool: p - window < key <= p (and key < seq_len)


def decode_window(tables: np.ndarray, seq_lens: np.ndarray, block_size: int, window: int | None) -> DecodeWindow:
    """Which keys each decode row (query at seq_len - 1) sees; window None: its whole context."""
    b, max_blocks = tables.shape
    n = max_blocks if window is None else min(max_blocks, window_blocks(window, block_size))
    lo = np.zeros(b, np.int64) if window is None else np.maximum(seq_lens.astype(np.int64) - window, 0)
    # Start at the block holding the window's first key, but never run past the table's end.
    first = np.minimum(lo // block_size, max_blocks - n)
    cols = first[:, None] + np.arange(n)[None, :]
    key_pos = first[:, None] * block_size + np.arange(n * block_size)[None, :]
    mask = (key_pos >= lo[:, None]) & (key_pos < seq_lens[:, None])
    return DecodeWindow(np.take_along_axis(tables, cols, axis=1).astype(np.int32), key_pos.astype(np.int32), mask)


def prefill_window_mask(first_pos: int, n_q: int, key_start: int, n_k: int, window: int | None) -> np.ndarray:
    """[n_q, n_k] bool: query first_pos + i sees key key_start + j (causal, and within the window)."""
    qp = first_pos + np.arange(n_q)[:, None]
    kp = key_start + np.arange(n_k)[None, :]
    allowed = kp <= qp
    if window is not None:
        allowed &= kp > qp - window
    return allowed


def prefill_key_start(first_pos: int, window: int | None) -> int:
    """First context position any query of a chunk starting at first_pos can see."""
    return 0 if window is None else max(0, first_pos - window + 1)


def plan_attention(batch: ScheduledBatch) -> AttentionPlan:
    bs = batch.block_size
    starts, seq_lens = batch.query_start_loc, batch.seq_lens
    q_lens = np.diff(starts)
    plan = AttentionPlan()
    decode = np.flatnonzero(q_lens == 1)
    order: list[np.ndarray] = []
    if decode.size:
        max_len = int(seq_lens[decode].max())
        max_blocks = -(-max_len // bs)
        tables = np.zeros((decode.size, max_blocks), dtype=np.int64)
        for r, i in enumerate(decode):
            bt = batch.block_tables[i][:max_blocks]
            tables[r, : len(bt)] = bt
        plan.decode_token_idx = starts[decode].astype(np.int32)
        plan.decode_block_tables = np.maximum(tables, 0).astype(np.int32)  # released (-1) -> block 0
        plan.decode_seq_lens = seq_lens[decode].astype(np.int32)
        plan.decode_seqs = decode
        order.append(plan.decode_token_idx)
    for i in np.flatnonzero(q_lens > 1):
        start, end, ctx = int(starts[i]), int(starts[i + 1]), int(seq_lens[i])
        table = np.maximum(np.asarray(batch.block_tables[i], dtype=np.int64), 0)
        slots = _slots(table, ctx, bs) if ctx > end - start else None
        plan.prefills.append(PrefillPlan(start, end, slots, table.astype(np.int32), ctx, int(i)))
        order.append(np.arange(start, end))
    if order:
        flat = np.concatenate(order)
        if not np.array_equal(flat, np.arange(flat.size)):
            inverse = np.empty_like(flat)
            inverse[flat] = np.arange(flat.size)
            plan.restore_order = inverse.astype(np.int32)
    plan.logits_idx = (starts[1:][batch.sample_seq_indices] - 1).astype(np.int32)
    if batch.prompt_rows:  # rows scoring prompt tokens (prompt_logprobs), after the sampled ones
        scored = [np.arange(r.start, r.start + len(r.targets)) for r in batch.prompt_rows]
        plan.logits_idx = np.concatenate([plan.logits_idx, *scored]).astype(np.int32)
    return plan
