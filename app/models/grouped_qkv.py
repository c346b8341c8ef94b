"""Fused q/k/v projections stored head group by head group, reordered to q rows, then k, then v (the layout
weight_stream.split_fused cuts): GPT-NeoX's and GPT-BigCode's per-head [q, k, v] (a group per head, one query
head in each), Falcon's per-KV-group [q heads of the group..., k, v] (multi-query: one group of all heads).

A row permutation of float, affine and MLX-packed weights alike (rows are independent in each), so a quantized
checkpoint stays quantized; an FP8 weight's scale blocks span rows, so it is dequantized first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mlx_packed import MlxPacked


def stacked_order(groups: int, q_per_group: int, head_dim: int) -> np.ndarray:
    """Row indices that take [group][q_per_group query heads, one key head, one value head][head_dim] to
    [all query heads][all key heads][all value heads] (each head's head_dim rows kept together)."""
    width = (q_per_group + 2) * head_dim  # rows of one group
    dims = np.arange(head_dim)
    starts = np.arange(groups)[:, None] * width
    q = (starts + (np.arange(q_per_group) * head_dim)[None, :])[..., None] + dims
    k = starts + q_per_group * head_dim + dims[None, :]
    v = starts + (q_per_group + 1) * head_dim + dims[None, :]
    return np.concatenate([q.reshape(-1), k.reshape(-1), v.reshape(-1)])


def reorder_rows(value: Any, order: np.ndarray) -> Any:
    """value's rows (a weight's output rows or a bias's entries) in `order`, staying in its own format."""
    if value.shape[0] != len(order):
        raise ValueError(f"a fused q/k/v of {value.shape[0]} rows; the config implies {len(order)}")
    if np.array_equal(order, np.arange(len(order))):  # (Falcon 7B's multi-query layout is already q, k, v)
        return value
    if isinstance(value, MxWeight):  # microscaled: its shared scales are per row too, but read as the affine form
        value = value.portable()
    if isinstance(value, MlxPacked):  # (rows of packed words: stays in MLX's layout)
        return replace(value, words=value.words[order], scales=value.scales[order], biases=value.biases[order])
    if isinstance(value, AffineWeight):
        return value.map_rows(lambda a: a[order])
    if isinstance(value, Fp8Weight):
        value = value.dequantize()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value[order])
    return value[_as_index(value, order)]  # a torch tensor or an MLX array


def _as_index(value: Any, order: np.ndarray) -> Any:
    if type(value).__module__.startswith("torch"):
        import torch

        return torch.from_numpy(order)
    import mlx.core as mx

    return mx.array(order)
