"""Rotary embeddings of the MLX model files: one builder for every rope ModelConfig accepts.

Plain, linear, llama3 and dynamic ropes are mlx_lm's. YaRN and LongRoPE are computed here the way
transformers' modeling_rope_utils computes them (the torch backend calls those initialisers), as
per-pair frequencies plus an attention factor that scales cos and sin. mlx_lm's differ where real
configs go: its YaRN derives the attention factor from mscale / mscale_all_dim even when only one
is given (transformers then takes the plain one), and its LongRoPE always uses the long factors.

Positions come one per token (`offset` an array): the paged batch flattens every sequence's tokens.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.rope_utils import initialize_rope

from lantern.app.models.rope_config import longrope_factors


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _periods(dims: int, base: float) -> np.ndarray:
    """base ** (2i / dims) per rotated pair, in float32 as transformers computes it."""
    return np.float32(base) ** (np.arange(0, dims, 2).astype(np.float32) / np.float32(dims))


def yarn_inv_freq(dims: int, base: float, scaling: dict[str, Any], max_pos: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [dims / 2], attention factor): transformers' _compute_yarn_parameters."""
    factor = scaling.get("factor")
    original = scaling["original_max_position_embeddings"]
    if factor is None:
        factor = max_pos / original
    factor = float(factor)
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        # Both present: their ratio (DeepSeek; 1 when equal). Otherwise the plain YaRN factor.
        attention = _mscale(factor, mscale) / _mscale(factor, all_dim) if mscale and all_dim else _mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dims // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: the pair keeps its original frequency
    periods = _periods(dims, base)
    inv_freq = (1.0 / (np.float32(factor) * periods)) * (1 - extrapolation) + (1.0 / periods) * extrapolation
    return inv_freq.astype(np.float32), float(attention)


def longrope_inv_freq(dims: int, base: float, scaling: dict[str, Any], max_pos: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [dims / 2], attention factor): transformers' _compute_longrope_parameters
    with the factors rope_config.longrope_factors picks for this model."""
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_pos / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(scaling[longrope_factors(scaling, max_pos)], dtype=np.float32)
    return (1.0 / (ext * _periods(dims, base))).astype(np.float32), float(attention)


class FreqRoPE(nn.Module):
    """Rope of given inverse frequencies on the first `dims` dims of each head; those dims are
    scaled by the attention factor (transformers scales cos and sin: the same product)."""

    def __init__(self, dims: int, inv_freq: np.ndarray, traditional: bool, attention_factor: float = 1.0):
        super().__init__()
        self.dims, self.traditional, self.attention_factor = dims, traditional, attention_factor
        self._freqs = mx.array(1.0 / inv_freq.astype(np.float64), dtype=mx.float32)  # mx.fast.rope's periods

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if self.attention_factor != 1.0:
            if self.dims == x.shape[-1]:
                x = x * self.attention_factor
            else:
                x = x.at[..., : self.dims].multiply(self.attention_factor)
        return mx.fast.rope(
            x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


_COMPUTED = {"yarn": yarn_inv_freq, "longrope": longrope_inv_freq}


def build_rope(
    dims: int, base: float, traditional: bool, scaling: dict[str, Any] | None, max_position_embeddings: int
) -> nn.Module:
    """The rope of `dims` rotated dims (a config's rotary_dim) for spec._rope_scaling's normalized
    scaling (None: plain); traditional: rotate adjacent pairs (GLM-4, DeepSeek) rather than halves."""
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type in _COMPUTED:
        inv_freq, attention = _COMPUTED[rope_type](dims, float(base), scaling, max_position_embeddings)
        return FreqRoPE(dims, inv_freq, traditional, attention)
    return initialize_rope(dims, base, traditional, scaling, max_position_embeddings)
