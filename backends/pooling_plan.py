"""Backend-neutral index arrays for embedding steps (numpy), shared by both backends like
paged_plan.py: which rows of a flattened batch each PoolingRow reads, how they reduce, and the
padded [sequences, longest] layout a bidirectional encoder attends in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lantern.app.engine.contract import PoolingRow, ScheduledBatch


def pooled_rows(batch: ScheduledBatch, rows: list[PoolingRow]) -> tuple[np.ndarray, np.ndarray]:
    """(idx, bounds): the flattened batch's rows whose final hidden states the pooling reads, and
    per PoolingRow r the slice idx[bounds[r]:bounds[r + 1]] it reduces (one row for "last" and
    "first", the whole chunk for "sum")."""
    qs = batch.query_start_loc
    parts: list[np.ndarray] = []
    for row in rows:
        start, end = int(qs[row.seq_index]), int(qs[row.seq_index + 1])
        if row.mode == "last":
            parts.append(np.array([end - 1]))
        elif row.mode == "first":
            parts.append(np.array([start]))
        elif row.mode == "sum":
            parts.append(np.arange(start, end))
        else:
            raise ValueError(f"unknown pooling mode {row.mode!r}")
    bounds = np.cumsum([0] + [len(p) for p in parts])
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return idx.astype(np.int32), bounds


def reduce_pooled(hidden: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """Per PoolingRow its vector from hidden [len(idx), H]: segment sums in float64 (a mean over
    hundreds of tokens then loses nothing to the order of the adds), returned as float32."""
    if len(bounds) < 2:
        return []
    sums = np.add.reduceat(hidden.astype(np.float64), bounds[:-1], axis=0)
    return [s.astype(np.float32) for s in sums]


@dataclass
class EncoderLayout:
    """The flattened batch as [S, L] padded sequences (L the longest) for bidirectional attention."""

    gather: np.ndarray  # [S, L] int32: flat row of each padded position (padding reads row 0)
    valid: np.ndarray  # [S, L] bool: a real token (keys at False positions are masked out)
    scatter: np.ndarray  # [T] int32: each flat row's index in the padded order (s * L + j)


def encoder_layout(query_start_loc: np.ndarray) -> EncoderLayout:
    starts = np.asarray(query_start_loc, dtype=np.int64)
    lens = np.diff(starts)
    longest = int(lens.max()) if lens.size else 0
    j = np.arange(longest)[None, :]
    valid = j < lens[:, None]
    gather = np.where(valid, starts[:-1, None] + j, 0)
    scatter = np.concatenate([s * longest + np.arange(n) for s, n in enumerate(lens)]) if lens.size else j[0]
    return EncoderLayout(gather.astype(np.int32), valid, scatter.astype(np.int32))
