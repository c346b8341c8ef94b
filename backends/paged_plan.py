"""Backend-neutral attention plan for one ScheduledBatch, in numpy.

Both backends attend the same way: single-token queries (decodes) in one padded batch that
gathers each sequence's context block by block, and each multi-token prefill chunk on its own
(reading its cached prefix back from the pool when there is one). This module computes the index
arrays once per step; each backend only converts them to its own arrays.
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
    block_table: np.ndarray  # [blocks] int32
    ctx_len: int


@dataclass
class AttentionPlan:
    decode_token_idx: np.ndarray | None = None  # [B] rows of the flattened batch
    decode_block_tables: np.ndarray | None = None  # [B, max_blocks] int32 (kernels read these)
    decode_seq_lens: np.ndarray | None = None  # [B] int32
    prefills: list[PrefillPlan] = field(default_factory=list)
    restore_order: np.ndarray | None = None  # [T] int32; None when pieces are already in order
    logits_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # last token of sampled seqs


def _slots(table: np.ndarray, n: int, block_size: int) -> np.ndarray:
    j = np.arange(n)
    return (table[..., j // block_size] * block_size + j % block_size).astype(np.int32)


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
        plan.decode_block_tables = tables.astype(np.int32)
        plan.decode_seq_lens = seq_lens[decode].astype(np.int32)
        order.append(plan.decode_token_idx)
    for i in np.flatnonzero(q_lens > 1):
        start, end, ctx = int(starts[i]), int(starts[i + 1]), int(seq_lens[i])
        table = np.asarray(batch.block_tables[i], dtype=np.int64)
        slots = _slots(table, ctx, bs) if ctx > end - start else None
        plan.prefills.append(PrefillPlan(start, end, slots, table.astype(np.int32), ctx))
        order.append(np.arange(start, end))
    if order:
        flat = np.concatenate(order)
        if not np.array_equal(flat, np.arange(flat.size)):
            inverse = np.empty_like(flat)
            inverse[flat] = np.arange(flat.size)
            plan.restore_order = inverse.astype(np.int32)
    plan.logits_idx = (starts[1:][batch.sample_seq_indices] - 1).astype(np.int32)
    return plan
