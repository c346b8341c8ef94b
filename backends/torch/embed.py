"""Embedding steps on the torch backend (backends/base.EmbeddingBackend.embed).

A decoder runs the batch exactly like a generation step (paged attention, the KV pool written,
chunked prompts reading their earlier chunks back) and returns the final norm's output at the rows
the pooling reads instead of logits. A bidirectional encoder (BERT) gets whole sequences and runs
without the pool. Reductions happen on the host in float64 (backends/pooling_plan.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lantern.app.engine.contract import PoolingRow, ScheduledBatch
from lantern.backends.paged_plan import plan_attention
from lantern.backends.pooling_plan import encoder_layout, pooled_rows, reduce_pooled
from lantern.backends.torch.attention import build_metadata


@torch.inference_mode()
def embed_step(backend: Any, batch: ScheduledBatch, rows: list[PoolingRow]) -> list[np.ndarray]:
    """backend: a loaded TorchBackend (one rank: the engine refuses embeddings with tensor parallelism)."""
    device = backend.device
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device, torch.long)
    idx, bounds = pooled_rows(batch, rows)
    ids = as_t(batch.input_ids)
    model = backend.model
    if getattr(model, "is_encoder", False):
        from lantern.backends.torch.models.bert import EncoderInputs

        layout = encoder_layout(batch.query_start_loc)
        positions = as_t(batch.positions)
        inputs = EncoderInputs(
            positions=positions,
            token_types=torch.zeros_like(positions) if batch.token_types is None else as_t(batch.token_types),
            gather=as_t(layout.gather),
            key_mask=torch.from_numpy(layout.valid).to(device)[:, None, None, :],
            scatter=as_t(layout.scatter),
        )
        hidden = model(ids, inputs)[as_t(idx)]
    else:
        meta = build_metadata(backend.pool, batch, plan_attention(batch), backend.cos, backend.sin)
        hidden = model.hidden_states(ids, meta, as_t(idx))
    return reduce_pooled(hidden.float().cpu().numpy(), bounds)
