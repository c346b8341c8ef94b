"""GGUF's codebook and float-4 types -> the exact affine form, by way of the `gguf` package's decoder.

These types store weights as indices into tables (IQ4's 16 non-uniform levels, IQ1/IQ2/IQ3's lattice
grids of 8 or 4 values, ternary TQ, e2m1 floats in MXFP4/NVFP4), so no 4-bit (or narrower) affine
code reproduces them. But every value they decode to is a whole number times its group's scale, with
the whole numbers small enough for 2, 5 or 8 bits; so each tensor is held exactly as affine codes:

    type      group  integer levels (value / scale)           bits  scale per group
    IQ4_NL    32     IQ4's table: -127 .. 113                  8     d
    IQ4_XS    32     IQ4's table                               8     d * (ls - 32)       (6-bit ls)
    IQ3_XXS   32     grid 4 .. 62, signed                      8     d * (0.5 + ls) / 2  (4-bit ls)
    IQ3_S     32     grid 1 .. 15 (odd), signed                5     d * (1 + 2 ls)
    IQ2_XXS   32     grid 8, 25, 43, signed                    8     d * (0.5 + ls) / 4
    IQ2_XS    16     grid 8, 25, 43, signed                    8     d * (0.5 + ls) / 4
    IQ2_S     16     grid 8, 25, 43, signed                    8     d * (0.5 + ls) / 4
    IQ1_S     32     8 (g +- 1/8), g in -1, 0, 1: -9 .. 9      5     d * (2 ls + 1) / 8  (3-bit ls)
    IQ1_M     16     as IQ1_S                                  5     d * (2 ls + 1) / 8
    TQ1_0     256    -1, 0, 1                                  2     d                   (held as g32)
    TQ2_0     256    -1, 0, 1                                  2     d                   (held as g32)
    MXFP4     32     2 x e2m1: 0 .. +-12                       5     2^(e - 128)         (e8m0 e)
    NVFP4     16     2 x e2m1                                  5     ue4m3 / 2

The values come from `gguf.quants.dequantize` (the package's reference decoder of the grids and
sign tables); this module reads only the scale fields of ggml's block structs and divides: the
quotient is the integer level, checked to reproduce every value. (IQ4_NL / IQ4_XS, the common
ones, skip the decoder: their nibbles index the package's 16-level table directly.) The cost is memory where a backend
has no codebook layout (MLX's and CUDA's kernels): a weight takes its affine width instead of the
file's 1.6-4.5 bits (logged when a file has such tensors). torch's VNNI CPU layers hold codes of at
most 16 values as 4-bit indices into a table (cpu_vnni_gemm.codebook): IQ4's 4.25-4.5 bits become 5;
its CUDA layers hold MXFP4 / NVFP4 as e2m1 nibbles again (microscaled.e2m1_codes).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lantern.app.models.quant.affine import AffineWeight

QK_K = 256
_CHUNK = 1 << 22  # weights decoded at a time: bounds the float32 temporaries of a large tensor


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 2]).view(np.float16).astype(np.float32)


def _u32(b: np.ndarray, at: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 4 * count]).view(np.uint32)


def _nibble_scales(packed: np.ndarray) -> np.ndarray:
    """Bytes holding two 4-bit scales each, the low nibble first."""
    n, size = packed.shape
    out = np.empty((n, size, 2), dtype=np.float32)
    out[:, :, 0] = packed & 0x0F
    out[:, :, 1] = packed >> 4
    return out.reshape(n, 2 * size)


# ---- scale of each group, from a type's block fields: [n_blocks, bytes] -> float32 [n_blocks, groups] ----
def _iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    # d, scales_h (u16: 2 high bits per sub-block), scales_l[4] (a nibble per sub-block), qs[128]
    high = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    shifts = np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)
    ls = _nibble_scales(b[:, 4:8]) + 16.0 * ((high >> shifts) & 3).astype(np.float32)
    return _f16(b, 0) * (ls - np.float32(32))


def _quarter_grid(d: np.ndarray, ls: np.ndarray, step: float) -> np.ndarray:
    return d * (np.float32(0.5) + ls) * np.float32(step)


def _iq2_xxs(b: np.ndarray) -> np.ndarray:
    # d, then per 32 weights two u32: grid indices, and signs with the 4-bit scale in the top bits
    words = _u32(b, 2, 16)[:, 1::2]
    return _quarter_grid(_f16(b, 0), (words >> 28).astype(np.float32), 0.25)


def _iq2_xs(b: np.ndarray) -> np.ndarray:
    return _quarter_grid(_f16(b, 0), _nibble_scales(b[:, 66:74]), 0.25)  # d, qs u16[32], scales[8]


def _iq2_s(b: np.ndarray) -> np.ndarray:
    return _quarter_grid(_f16(b, 0), _nibble_scales(b[:, 74:82]), 0.25)  # d, qs, signs, qh[8], scales[8]


def _iq3_xxs(b: np.ndarray) -> np.ndarray:
    words = _u32(b, 66, 8)  # d, qs[64], then per 32 weights a u32 of signs with the scale on top
    return _quarter_grid(_f16(b, 0), (words >> 28).astype(np.float32), 0.5)


def _iq3_s(b: np.ndarray) -> np.ndarray:
    # d, qs[64], qh[8], signs[32], scales[4]
    return _f16(b, 0) * (np.float32(1) + np.float32(2) * _nibble_scales(b[:, 106:110]))


def _iq1_s(b: np.ndarray) -> np.ndarray:
    qh = np.ascontiguousarray(b[:, 34:50]).view(np.uint16)  # d, qs[32], qh u16[8] (scale in bits 12-14)
    return _f16(b, 0) * (np.float32(2) * ((qh >> 12) & 7).astype(np.float32) + np.float32(1)) * np.float32(0.125)


def _iq1_m(b: np.ndarray) -> np.ndarray:
    # qs[32], qh[16], scales u16[4]: four 3-bit scales each, and the float16 d in their top nibbles
    sc = np.ascontiguousarray(b[:, 48:56]).view(np.uint16)
    top = sc & np.uint16(0xF000)
    d_bits = (top[:, 0] >> 12) | (top[:, 1] >> 8) | (top[:, 2] >> 4) | top[:, 3]
    d = d_bits.astype(np.uint16).view(np.float16).astype(np.float32)[:, None]
    shifts = np.array([0, 3, 6, 9], dtype=np.uint16).reshape(1, 1, 4)
    ls = ((sc[:, :, None] >> shifts) & 7).reshape(-1, 16).astype(np.float32)
    return d * (np.float32(2) * ls + np.float32(1)) * np.float32(0.125)


def _tq(at: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: np.repeat(_f16(b, at), QK_K // 32, axis=1)  # one d per 256, held per 32


def _mxfp4(b: np.ndarray) -> np.ndarray:
    import gguf  # e8m0 exponent e as half its power of two (the package's table holds doubled e2m1 values)

    return np.asarray(gguf.quants.MXFP4.e8m0_to_fp32_half(b[:, 0:1]), np.float32)


def _nvfp4(b: np.ndarray) -> np.ndarray:
    import gguf  # four unsigned e4m3 scales, one per 16 weights, halved as the package decodes them

    return np.asarray(gguf.quants.NVFP4.ue4m3_to_fp32(b[:, 0:4]), np.float32)


# type -> (weights per group, bits, lowest level, scales of a block's groups)
DECODED: dict[str, tuple[int, int, int, Callable[[np.ndarray], np.ndarray]]] = {
    "IQ4_NL": (32, 8, -128, _iq4_nl),
    "IQ4_XS": (32, 8, -128, _iq4_xs),
    "IQ3_XXS": (32, 8, -128, _iq3_xxs),
    "IQ3_S": (32, 5, -16, _iq3_s),
    "IQ2_XXS": (32, 8, -128, _iq2_xxs),
    "IQ2_XS": (16, 8, -128, _iq2_xs),
    "IQ2_S": (16, 8, -128, _iq2_s),
    "IQ1_S": (32, 5, -16, _iq1_s),
    "IQ1_M": (16, 5, -16, _iq1_m),
    "TQ1_0": (32, 2, -1, _tq(52)),  # levels -1, 0, 1 (2 as well in TQ2_0's spare code)
    "TQ2_0": (32, 2, -1, _tq(64)),
    "MXFP4": (32, 5, -16, _mxfp4),
    "NVFP4": (16, 5, -16, _nvfp4),
}


# Block types gguf_blocks reads directly that are still held wider than the file: type -> bits of the
# affine form (Q1_0's 2-bit codes; torch's CPU and CUDA layers hold them as 4-bit ones)
HELD_WIDER: dict[str, int] = {"Q1_0": 2}


def file_bits_per_weight(qtype: str) -> float:
    import gguf

    per_block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    return 8.0 * nbytes / per_block


def widening_note(counts: dict[str, int]) -> str:
    """One line for a file with DECODED / HELD_WIDER tensors (type -> how many): what each is held as, and why."""
    kinds = ", ".join(
        f"{n} {q} ({file_bits_per_weight(q):.2f} -> {DECODED[q][1] if q in DECODED else HELD_WIDER[q]} bits per weight)"
        for q, n in sorted(counts.items())
    )
    return (
        f"GGUF tensors read as exact affine codes wider than the file's: {kinds}, plus a scale and bias "
        "per group. They take that much memory where the backend has no codebook layout (MLX, CUDA, CPUs "
        "without the native kernels; 2-bit codes take 4 bits on torch); torch's CPU layers hold those of at "
        "most 16 levels in 32-wide groups at 4 bits, and its CUDA layers MXFP4 / NVFP4 as 4-bit e2m1"
    )


def decoded_to_weight(qtype: str, data: np.ndarray, rows: int, cols: int) -> AffineWeight:
    """A `DECODED` type's tensor [rows, cols] (uint8 blocks) as its exact AffineWeight; raises
    ValueError where a value is not its group's scale times a level of the type (a damaged block)."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    per_block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    group, bits, lowest, scale_of = DECODED[qtype]
    blocks = data.reshape(rows, cols // per_block * nbytes)
    codes = np.empty((rows, cols), dtype=np.uint8)
    scales = np.empty((rows, cols // group), dtype=np.float32)
    step = max(1, _CHUNK // cols)
    for r in range(0, rows, step):
        part = blocks[r : r + step]
        n = part.shape[0]
        s = scale_of(part.reshape(-1, nbytes)).reshape(n, -1, 1)
        if not np.isfinite(s).all():
            raise ValueError(f"GGUF {qtype}: rows {r}..{r + n}: a block scale is not a finite number")
        scales[r : r + n] = s.reshape(n, -1)
        if qtype in _IQ4_CODES_AT:  # the table's levels read straight from the nibbles: ~10x faster
            codes[r : r + n] = _iq4_codes(part.reshape(-1, nbytes), qtype).reshape(n, cols)
            continue
        with np.errstate(all="ignore"):
            values = gguf.quants.dequantize(part, qt).astype(np.float32, copy=False).reshape(n, -1, group)
            levels = np.where(s != 0, np.rint(values / s), 0)  # a zero scale decodes every value to 0
        # each value within float32 rounding of its level times its own group's scale
        if not (np.abs(levels * s - values) <= 2.0**-16 * np.abs(s)).all():
            raise ValueError(f"GGUF {qtype}: rows {r}..{r + n}: values are not whole levels of their block scales")
        codes[r : r + n] = _checked_codes(levels - lowest, bits, qtype).reshape(n, cols)
    return AffineWeight(codes, scales, np.float32(lowest) * scales, bits, group, f"GGUF {qtype}")


_IQ4_CODES_AT = {"IQ4_NL": 2, "IQ4_XS": 8}  # byte offset of the nibbles: after d (and IQ4_XS's scales)


def _iq4_codes(b: np.ndarray, qtype: str) -> np.ndarray:
    """IQ4 codes: per 16 bytes, the low nibbles index 16 weights and the high nibbles the next 16
    (gguf's IQ4 dequantizers' order); each index's level is the package's table, + 128."""
    import gguf

    from lantern.app.models.quant.gguf_blocks import _nibbles  # (imported here: gguf_blocks imports this module)

    table = (np.array(gguf.quants.IQ4_NL.kvalues, np.int16) + 128).astype(np.uint8)
    return table[_nibbles(np.ascontiguousarray(b[:, _IQ4_CODES_AT[qtype] :]), 16)]


def _checked_codes(codes: np.ndarray, bits: int, qtype: str) -> np.ndarray:
    if codes.size and (codes.min() < 0 or codes.max() >= 2**bits):
        raise ValueError(f"GGUF {qtype}: a level falls outside {bits}-bit codes ({codes.min()}..{codes.max()})")
    return codes.astype(np.uint8)
