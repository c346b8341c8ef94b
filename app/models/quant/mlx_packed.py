"""MLX folders' quantized modules (mlx-community, mlx_lm.convert), read by hf_formats.read_quantized_module.

Affine weights can stay as MLX packed them (`MlxPacked`): the MLX backend hands the stored words to
QuantizedLinear as they are instead of unpacking every code to a byte and packing it again (~2.4 s a
670M-weight model on a 2-core Zen 4: most of its load); anything else asks `to_affine()` for the shared
form. Microscaled modes (uint8 scales) are MxWeight as stored; stacked experts ([E, out, words]: mlx_lm's
switch_mlp) are StackedWeights, read one expert at a time."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.hf_formats import MLX_BITS, MLX_GROUPS, QuantScheme, _f32, _unpack, _words
from lantern.app.models.quant.microscaled import MODES as MX_MODES
from lantern.app.models.quant.microscaled import MxWeight, checked
from lantern.app.models.quant.stacked import StackedWeights


@dataclass
class MlxPacked:
    words: np.ndarray  # uint32 [rows, cols * bits / 32]: each row one little-endian bit stream of its codes
    scales: np.ndarray  # float32 [rows, cols / group_size]
    biases: np.ndarray  # float32 [rows, cols / group_size]; w = code * scale + bias
    bits: int
    group_size: int
    source: str
    perm: None = None  # (MLX folders have no act-order permutation)

    def __post_init__(self) -> None:
        rows, groups = self.scales.shape
        words = groups * self.group_size * self.bits // 32
        if self.words.shape != (rows, words) or self.biases.shape != self.scales.shape:
            raise ValueError(
                f"{self.source}: words {self.words.shape}, scales {self.scales.shape}, biases {self.biases.shape} "
                f"do not make a {self.bits}-bit g{self.group_size} matrix"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.group_size

    def to_affine(self) -> AffineWeight:
        codes = _unpack(self.words, self.bits, self.shape[1])
        return AffineWeight(codes, self.scales, self.biases, self.bits, self.group_size, self.source)

    def dequantize(self, dtype: np.dtype | type = np.float32) -> np.ndarray:
        return self.to_affine().dequantize(dtype)

    def stored(self) -> MlxPacked:
        return self

    def rows(self, start: int, end: int) -> MlxPacked:
        return MlxPacked(
            self.words[start:end],
            self.scales[start:end],
            self.biases[start:end],
            self.bits,
            self.group_size,
            self.source,
        )


# mlx_lm's nvfp4 with a tensor scale g (one per expert): w = e2m1 * scale * g / (6 * 448), as mx.dequantize
_NVFP4_GLOBAL_UNIT = 6.0 * 448.0


def read_mlx(
    scheme: QuantScheme, prefix: str, t: dict[str, np.ndarray], keep_words: bool = False
) -> AffineWeight | MlxPacked | MxWeight | StackedWeights:
    """keep_words: affine weights as MlxPacked (MLX takes the stored words as they are)."""
    if np.ndim(t["weight"]) == 3:  # stacked experts [E, out, words], one weight each (global_scale: [E])
        one = lambda e: read_mlx(scheme, prefix, {k: v[e] for k, v in t.items()}, keep_words)
        return StackedWeights(one, len(t["weight"]))
    w, scales, biases = _words(t["weight"], f"{prefix}.weight"), t["scales"], t.get("biases")
    mode = scheme.mode_for(prefix)
    if mode is None:
        raise ValueError(f"{prefix} is quantized in the file but config.json's `quantization` says it is not")
    if scales.dtype == np.uint8:  # a microscaled mode: its shapes say which (as mlx_lm infers it)
        weight = _read_mx(scheme.mlx_mode_for(prefix), prefix, w, scales)
        if "global_scale" in t:
            if weight.mode != "nvfp4":
                raise ValueError(f"{prefix}.global_scale with {weight.mode} weights (MLX takes one for nvfp4 only)")
            unit = float(np.asarray(t["global_scale"], np.float32).reshape(())) / _NVFP4_GLOBAL_UNIT
            weight = replace(weight, global_scale=unit)
        return weight
    if "global_scale" in t:
        raise ValueError(f"{prefix}.global_scale beside affine weights (MLX takes one for nvfp4 only)")
    if not np.issubdtype(scales.dtype, np.floating) or biases is None:
        raise ValueError(f"{prefix}: MLX affine weights have float scales and biases (got {scales.dtype} scales)")
    rows, groups = scales.shape
    bits, group = _mlx_shape_mode(mode, w.shape[1], groups)
    if w.shape[0] != rows or biases.shape != scales.shape:
        raise ValueError(f"{prefix}: weight {w.shape}, scales {scales.shape}, biases {biases.shape} do not match")
    packed = MlxPacked(np.ascontiguousarray(w), _f32(scales), _f32(biases), bits, group, f"MLX {bits}-bit g{group}")
    return packed if keep_words else packed.to_affine()


def _read_mx(configured: str, prefix: str, w: np.ndarray, scales: np.ndarray) -> MxWeight:
    fits = [m for m, (b, g) in MX_MODES.items() if w.shape[1] * 32 == scales.shape[1] * g * b]
    mode = configured if configured in fits else (fits[0] if fits else None)
    if mode is None or w.shape[0] != scales.shape[0]:
        raise ValueError(
            f"{prefix}: weight {w.shape} with uint8 scales {scales.shape} fits no mxfp4/nvfp4/mxfp8 layout"
        )
    return checked(MxWeight(mode, w, np.ascontiguousarray(scales), f"MLX {mode}"), prefix)


def _mlx_shape_mode(mode: tuple[int, int], words: int, groups: int) -> tuple[int, int]:
    """The (bits, group) the stored shapes hold: the configured mode, else (as mlx_lm infers from the
    shapes) the configured group with other bits, else the configured bits with another group."""
    bits, group = mode
    candidates = [(bits, group)] + [(b, group) for b in MLX_BITS] + [(bits, g) for g in MLX_GROUPS]
    for b, g in candidates:
        if words * 32 == groups * g * b:
            return b, g
    raise ValueError(f"MLX weight of {words} words per row and {groups} groups fits no {bits}-bit g{group} layout")
