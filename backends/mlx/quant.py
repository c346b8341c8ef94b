"""AffineWeight -> MLX's quantized layers (mx.quantized_matmul underneath), for every model file.

MLX's affine mode is the canonical form itself: codes packed little-endian into uint32, one scale
and one bias per group, bits 2/3/4/5/6/8, groups 32/64/128. So GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
Q4_K/Q5_K, MLX-community, AWQ and GPTQ weights map exactly (scales stored in the model dtype).
Group-16 k-quants (Q2_K, Q3_K, Q6_K) have no MLX layout: they are requantized to group 32 with
two more bits, and the error is logged; wider groups (per-channel GPTQ) map exactly. GPTQ act-order
weights keep their stored (sorted) columns in a PermutedQuantizedLinear, which gathers x first; weights whose
input is quantized per token (BitNet's act_bits) take an InputQuantizedLinear.
MLX-community folders in the microscaled modes (mxfp4, nvfp4, mxfp8: quant/microscaled.py) load as stored.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, in_input_order, pack_bits, regroup, requantize
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mlx_packed import MlxPacked

logger = logging.getLogger(__name__)

BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)


def to_mlx_arrays(
    w: AffineWeight | MlxPacked, dtype: mx.Dtype, errors: ErrorLog
) -> tuple[mx.array, mx.array, mx.array, int, int]:
    """(packed uint32 weight, scales, biases, bits, group_size) in MLX's layout.

    A group wider than 128 (per-channel GPTQ, g256) repeats its scale over groups of 128: exact.
    Group 16 (Q2_K, Q3_K, Q6_K) has no exact layout: it is requantized to group 32 with two more
    bits, which keeps the error small, and the error is logged.
    """
    if isinstance(w, MlxPacked):
        if w.bits in BITS and w.group_size in GROUPS:  # MLX's own layout: the stored words as they are
            scales, biases = _scale_array(w.scales, dtype), _scale_array(w.biases, dtype)
            return mx.array(w.words), scales, biases, w.bits, w.group_size
        w = w.to_affine()
    exact = regroup(w, tuple(reversed(GROUPS))) if w.bits in BITS else None
    if exact is None:
        if w.shape[1] % 32:
            raise ValueError(f"{w.source} weight of {w.shape[1]} columns: MLX needs a multiple of 32")
        bits = next(b for b in BITS if b >= min(w.bits + 2, 8))
        exact, err = requantize(w, bits, 32)
        errors.add(w.source, f"MLX {bits}-bit g32", err)
    packed = mx.array(pack_bits(exact.codes, exact.bits))
    scales, biases = _scale_array(exact.scales, dtype), _scale_array(exact.biases, dtype)
    return packed, scales, biases, exact.bits, exact.group_size


def _scale_array(values: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """Scales in the model dtype, or in float16 when the model is float32 and float16 holds them
    exactly (GGUF's Q4_0/Q4_1/Q8_0 store float16 scales): half the bytes, the same results, as
    quantized_matmul widens them to the activations' type."""
    if dtype == mx.float32:
        half = values.astype(np.float16)
        if np.array_equal(half.astype(np.float32), values):
            return mx.array(half)
    return mx.array(values).astype(dtype)


def quantized_module(
    old: nn.Module, w: AffineWeight | MlxPacked | MxWeight, dtype: mx.Dtype, errors: ErrorLog
) -> tuple[nn.Module, dict]:
    """A quantized replacement for `old` (Linear or Embedding) and its arrays, named as MLX names
    them (weight, scales, biases; `perm` for an act-order linear), for Module.load_weights."""
    if isinstance(w, MxWeight):
        if w.global_scale == 1.0 or not isinstance(old, nn.Embedding):  # MLX's own modes, taken as stored
            return _microscaled_module(old, w)
        w = w.portable()  # type: ignore[assignment]  # a lookup cannot scale its rows: the shared form
    if isinstance(old, nn.Embedding) and isinstance(w, AffineWeight):  # a lookup reads rows: no input to gather
        w = in_input_order(w, errors, "embedding")
    packed, scales, biases, bits, group = to_mlx_arrays(w.stored(), dtype, errors)
    rows, cols = w.shape
    arrays = {"weight": packed, "scales": scales, "biases": biases}
    act_bits = w.act_bits if isinstance(w, AffineWeight) else None  # (an MLX folder's words: never)
    if isinstance(old, nn.Embedding):
        # The lookup dequantizes in the scales' type: keep the model dtype for exact rows.
        arrays.update(scales=scales.astype(dtype), biases=biases.astype(dtype))
        new: nn.Module = nn.QuantizedEmbedding(rows, cols, group_size=group, bits=bits)
    elif w.perm is not None:
        if act_bits is not None:
            raise ValueError(f"{w.source}: an act-order weight whose input is quantized is not implemented")
        new = PermutedQuantizedLinear(cols, rows, bias="bias" in old, group_size=group, bits=bits)
        arrays["perm"] = mx.array(w.perm.astype(np.uint32))
    elif act_bits is not None:  # BitNet: x quantized per token first
        new = InputQuantizedLinear(cols, rows, bias="bias" in old, group_size=group, bits=bits, act_bits=act_bits)
    else:
        new = nn.QuantizedLinear(cols, rows, bias="bias" in old, group_size=group, bits=bits)
    return new, arrays


def _microscaled_module(old: nn.Module, w: MxWeight) -> tuple[nn.Module, dict]:
    rows, cols = w.shape
    arrays = {"weight": mx.array(w.packed), "scales": mx.array(w.scales)}
    if isinstance(old, nn.Embedding):
        return nn.QuantizedEmbedding(rows, cols, group_size=w.group_size, bits=w.bits, mode=w.mode), arrays
    if w.global_scale != 1.0:
        arrays["global_scale"] = mx.array([w.global_scale], dtype=mx.float32)
        return GlobalScaledQuantizedLinear(cols, rows, "bias" in old, w.group_size, w.bits, w.mode), arrays
    new = nn.QuantizedLinear(cols, rows, bias="bias" in old, group_size=w.group_size, bits=w.bits, mode=w.mode)
    return new, arrays


class GlobalScaledQuantizedLinear(nn.QuantizedLinear):
    """An NVFP4 weight with one float for the whole tensor (compressed-tensors' and ModelOpt's
    checkpoints): quantized_matmul on the stored codes and scales, times that float, then the bias."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool, group_size: int, bits: int, mode: str):
        super().__init__(input_dims, output_dims, bias=bias, group_size=group_size, bits=bits, mode=mode)
        self.global_scale = mx.ones((1,), dtype=mx.float32)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        # The unscaled products reach 6 * 448 per weight (the scale factor is ~1/2688 of it): float16
        # would overflow before the global scale brings them back, so float16 runs in float32 here.
        y = mx.quantized_matmul(
            x.astype(mx.float32) if x.dtype == mx.float16 else x,
            self["weight"],
            scales=self["scales"],
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )
        y = (y.astype(mx.float32) * self.global_scale).astype(x.dtype)  # a bf16 factor would be off by 0.4%
        return y + self["bias"] if "bias" in self else y


class PermutedQuantizedLinear(nn.QuantizedLinear):
    """A GPTQ act-order weight: the stored columns hold contiguous groups, and x's columns are
    gathered into that order (`perm`) before the quantized matmul."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool, group_size: int, bits: int):
        super().__init__(input_dims, output_dims, bias=bias, group_size=group_size, bits=bits)
        self.perm = mx.arange(input_dims, dtype=mx.uint32)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(mx.take(x, self.perm, axis=-1))

    def input_order(self, weight: mx.array) -> mx.array:
        """A dequantized weight [out, in] of this layer with its columns back in input order."""
        return mx.take(weight, mx.argsort(self.perm), axis=1)


class InputQuantizedLinear(nn.QuantizedLinear):
    """A weight whose layer quantizes its input per token first (AffineWeight.act_bits: BitNet's 8-bit
    activations): each row of x becomes round(x * q / max|x|) * max|x| / q, clamped to [-q - 1, q],
    q = 2**(bits - 1) - 1, in float32 (as transformers' AutoBitLinear computes it; its BitLinear rounds in the
    activations' dtype), then the quantized matmul."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool, group_size: int, bits: int, act_bits: int):
        super().__init__(input_dims, output_dims, bias=bias, group_size=group_size, bits=bits)
        self.levels = float(2 ** (act_bits - 1) - 1)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(quantize_rows(x, self.levels))


def quantize_rows(x: mx.array, levels: float) -> mx.array:
    """x with each row (last axis) on a symmetric grid of 2 * levels + 1 steps of max|row| / levels."""
    xf = x.astype(mx.float32)
    scale = levels / mx.maximum(mx.max(mx.abs(xf), axis=-1, keepdims=True), 1e-5)
    return (mx.clip(mx.round(xf * scale), -levels - 1, levels) / scale).astype(x.dtype)


def set_module(root: nn.Module, path: str, new: nn.Module) -> nn.Module:
    """Replace the submodule at a dotted path (list indices included); returns the old one."""
    *parents, last = path.split(".")
    obj: Any = root
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else getattr(obj, part)
    if isinstance(obj, list):  # a module in a list (Gemma 3n's altup_projections.0)
        old, obj[int(last)] = obj[int(last)], new
        return old
    old = getattr(obj, last)
    setattr(obj, last, new)
    return old


def get_module(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else getattr(obj, part)
    return obj
