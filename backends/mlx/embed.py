"""Embedding steps on the MLX backend (backends/base.EmbeddingBackend.embed).

A decoder runs the batch exactly like a generation step (paged attention, the KV pool written,
chunked prompts reading their earlier chunks back) and returns the final norm's output at the rows
the pooling reads instead of logits. A bidirectional encoder (BERT) gets whole sequences and runs
without the pool. Reductions happen on the host in float64 (backends/pooling_plan.py).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from lantern.app.engine.contract import PoolingRow, ScheduledBatch
from lantern.backends.mlx.paged_attention import build_metadata
from lantern.backends.paged_plan import plan_attention
from lantern.backends.pooling_plan import encoder_layout, pooled_rows, reduce_pooled


def embed_step(backend: Any, batch: ScheduledBatch, rows: list[PoolingRow]) -> list[np.ndarray]:
    """backend: a loaded MLXBackend."""
    idx, bounds = pooled_rows(batch, rows)
    ids = mx.array(batch.input_ids)
    model = backend.model
    if getattr(model, "is_encoder", False):
        from lantern.backends.mlx.models.bert import EncoderInputs

        layout = encoder_layout(batch.query_start_loc)
        positions = mx.array(batch.positions)
        inputs = EncoderInputs(
            positions=positions,
            token_types=mx.zeros_like(positions) if batch.token_types is None else mx.array(batch.token_types),
            gather=mx.array(layout.gather),
            key_mask=mx.array(layout.valid[:, None, None, :]),
            scatter=mx.array(layout.scatter),
        )
        hidden = model(ids, inputs)[mx.array(idx)].astype(mx.float32)
        mx.eval(hidden)
    else:
        meta = build_metadata(backend.pool, batch, plan_attention(batch))
        hidden = model.hidden_states(ids, meta, mx.array(idx)).astype(mx.float32)
        # The pools are materialized with the result, or the lazy graph would grow without end.
        mx.eval(hidden, backend.pool.k, backend.pool.v, getattr(backend.model, "state_arrays", list)())
    return reduce_pooled(np.array(hidden), bounds)
