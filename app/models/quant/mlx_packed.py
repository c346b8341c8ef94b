"""An affine weight as an MLX folder stores it (mlx-community, mlx_lm.convert): MLX's packed words kept, so
the MLX backend hands them to QuantizedLinear as they are instead of unpacking every code to a byte and
packing it again (~2.4 s a 670M-weight model on a 2-core Zen 4: most of its load). Anything else asks
`to_affine()` for the shared form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lantern.app.models.quant.affine import AffineWeight


@dataclass
class MlxPacked:
    words: np.ndarray  # uint32 [rows, cols * bits / 32]: each row one little-endian bit stream of its codes
    scales: np.ndarray  # float32 [rows, cols / group_size]
    biases: np.ndarray  # float32 [rows, cols / group_size]; w = code * scale + bias
    bits: int
    group_size: int
    source: str
    perm: None = None  # (MLX folders have no act-order permutation)

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.group_size

    def to_affine(self) -> AffineWeight:
        from lantern.app.models.quant.hf_formats import _unpack

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
