"""Microscaled float weights: MLX's `mxfp4`, `nvfp4` and `mxfp8` modes (`mlx_lm.convert --q-mode`).

Each group of input columns shares one 8-bit scale and each weight is a small float:

    mode    element          group  scale                        stored (MLX layout)
    mxfp4   e2m1 (4 bits)    32     e8m0: 2^(e - 127)            weight uint32 [out, in/8], scales uint8 [out, in/32]
    nvfp4   e2m1 (4 bits)    16     e4m3 (positive)              weight uint32 [out, in/8], scales uint8 [out, in/16]
    mxfp8   e4m3 (8 bits)    32     e8m0                         weight uint32 [out, in/4], scales uint8 [out, in/32]

Codes run little-endian through each row's words, as in MLX's affine layout. There are no biases.
compressed-tensors' `nvfp4-pack-quantized` / `mxfp4-pack-quantized` / `mxfp8-quantized` and NVIDIA
ModelOpt's NVFP4 store the same codes in bytes (low nibble first: the same stream) and the scales as
e4m3 / e8m0 bytes; their NVFP4 adds one float per tensor (`global_scale`).

MLX computes on them natively (`nn.QuantizedLinear(mode=...)`), so the MLX loader takes an `MxWeight`
as it is. For the other backends `portable()` gives the exact shared form: e2m1 takes the values
0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6, i.e. whole numbers -12..12 times half the group's scale, so an fp4
weight is a 5-bit affine weight (codes 0..24, bias -12 steps) with the file's groups; an mxfp8
weight is an FP8 weight with one power-of-two scale per 1x32 block (`Fp8Weight`). A backend with an
e2m1 kernel (torch on CUDA) gets the nibbles back from that form with `e2m1_codes`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lantern.app.models.quant.affine import E4M3_VALUES, AffineWeight, Fp8Weight, map_codes, unpack_bits

MODES = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}  # mode -> (bits, group size)
# e2m1 code -> value (sign bit 3, then exponent 2 bits, mantissa 1 bit; code 8 is -0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E2M1_TWICE = (2 * np.array(E2M1_VALUES)).astype(np.int32)  # twice each value: a whole number, as affine code + 12
_FP4_CODES = np.zeros(256, dtype=np.uint8)
_FP4_CODES[:16] = _E2M1_TWICE + 12
_E2M1_OF_TWICE = {int(t): c for c, t in enumerate(_E2M1_TWICE) if c != 8}  # twice a value -> its code (+0, not -0)


@dataclass
class MxWeight:
    mode: str  # a key of MODES
    packed: np.ndarray  # uint32 [rows, cols * bits / 32]
    scales: np.ndarray  # uint8 [rows, cols / group]
    source: str
    # One float multiplying the whole tensor (NVFP4 checkpoints for NVIDIA GPUs carry one: compressed-
    # tensors' 1 / weight_global_scale, ModelOpt's weight_scale_2); 1.0 in MLX's own folders.
    global_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"{self.source}: unknown microscaled mode {self.mode!r}")
        rows, groups = self.scales.shape
        if self.packed.shape != (rows, groups * self.group_size * self.bits // 32):
            raise ValueError(
                f"{self.source}: weight {self.packed.shape} and scales {self.scales.shape} do not make a "
                f"{self.mode} matrix (groups of {self.group_size})"
            )

    @property
    def bits(self) -> int:
        return MODES[self.mode][0]

    @property
    def group_size(self) -> int:
        return MODES[self.mode][1]

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.group_size

    def rows(self, start: int, end: int) -> MxWeight:
        return replace(self, packed=self.packed[start:end], scales=self.scales[start:end])

    def elements(self) -> np.ndarray:
        """uint8 [rows, cols]: each weight's e2m1 (4-bit) or e4m3 (8-bit) code."""
        return unpack_bits(self.packed, self.bits, self.shape[1])

    def scale_values(self) -> np.ndarray:
        """float32 [rows, groups]: e8m0 is 2^(e - 127) (255 is NaN); nvfp4's is an e4m3 value."""
        if self.mode == "nvfp4":
            out = E4M3_VALUES[self.scales]
        else:
            out = np.exp2(self.scales.astype(np.float32) - 127)
            out[self.scales == 255] = np.nan
        if self.global_scale != 1.0:  # in float64, rounded once: the product as a float32 division gives it
            out = (out.astype(np.float64) * self.global_scale).astype(np.float32)
        return out

    def portable(self) -> AffineWeight | Fp8Weight:
        """The same values in the shared form every backend packs (module docstring), exactly."""
        scales = self.scale_values()
        if not np.isfinite(scales).all():
            raise ValueError(f"{self.source}: a group scale is NaN (e8m0 255 or e4m3 NaN)")
        if self.mode == "mxfp8":
            return Fp8Weight(self.elements(), scales, (1, self.group_size), self.source)
        step = scales / 2
        codes = map_codes(_FP4_CODES, self.elements())
        return AffineWeight(codes, step, -12 * step, 5, self.group_size, self.source)

    def dequantize(self, dtype: np.dtype | type = np.float32) -> np.ndarray:
        return self.portable().dequantize(dtype)


def e2m1_codes(w: AffineWeight) -> tuple[np.ndarray, np.ndarray] | None:
    """(uint8 e2m1 codes [N, K], float32 scales [N, K / g]) with e2m1(code) * scale = w exactly, when `w`
    holds fp4 values: 5-bit codes o + 2 * value with bias -o steps, one offset o for the tensor
    (`portable()` writes o = 12, GGUF's MXFP4 / NVFP4 o = 16); the scale is twice the step. None for
    any other weight (so a backend with an e2m1 kernel keeps fp4 at 4 bits, whatever file it came from)."""
    if w.bits != 5 or w.perm is not None:
        return None
    s, b = w.scales, w.biases
    first = int(np.argmax(s.reshape(-1) != 0))  # (a bool mask: no index array over a large table)
    if s.size == 0 or s.flat[first] == 0:
        return None
    o = float(np.rint(-b.flat[first] / s.flat[first]))
    if not 0 <= o < 32 or not np.array_equal(b, np.float32(-o) * s):
        return None
    table = np.full(256, 255, np.uint8)
    for code in range(32):
        table[code] = _E2M1_OF_TWICE.get(code - int(o), 255)
    codes = map_codes(table, w.codes)
    if codes.max(initial=0) == 255:
        return None
    return codes, (s * 2).astype(np.float32)


def from_bytes(
    mode: str, data: np.ndarray, scales: np.ndarray, source: str, where: str, global_scale: float = 1.0
) -> MxWeight:
    """A weight whose codes are stored as bytes (two e2m1 per byte, low nibble first, or one e4m3 per
    byte) and whose scales are e4m3 / e8m0 bytes, as compressed-tensors and ModelOpt write them.
    `where` (the module) names it in errors."""
    data = np.ascontiguousarray(data).view(np.uint8)
    if data.ndim != 2 or data.shape[1] % 4:
        raise ValueError(f"{where}: {data.shape} bytes do not fill whole 32-bit words per row")
    words = data.view("<u4").astype(np.uint32, copy=False)
    try:
        w = MxWeight(mode, words, np.ascontiguousarray(scales).view(np.uint8), source, float(global_scale))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return checked(w, where)


def checked(w: MxWeight, where: str) -> MxWeight:
    """`w`, once every group scale is a number (e8m0 255 and e4m3 0x7F/0xFF are NaN: the file is broken)."""
    if not np.isfinite(w.scale_values()).all():
        raise ValueError(f"{where}: a {w.mode} group scale is NaN (e8m0 255 or e4m3 NaN bits)")
    return w
