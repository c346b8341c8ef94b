"""GGUF tensor blocks -> the exact affine form (`AffineWeight`), vectorised numpy.

Every GGUF block type that Q4_0..Q8_0 and Q2_K..Q6_K files contain is an affine code per weight
with one scale and one offset per small group, so it maps without loss:

    type   bits  group  w                              scale            bias
    Q4_0   4     32     d * (q - 8)                    d                -8 d
    Q4_1   4     32     d * q + m                      d                m
    Q5_0   5     32     d * (q - 16)                   d                -16 d
    Q5_1   5     32     d * q + m                      d                m
    Q8_0   8     32     d * q  (q int8)                d                -128 d   (code = q + 128)
    Q2_K   2     16     d * sc * q - dmin * mn         d * sc           -dmin * mn   (4-bit sc, mn)
    Q3_K   3     16     d * (sc - 32) * (q - 4)        d * (sc - 32)    -4 scale     (6-bit sc)
    Q4_K   4     32     d * sc * q - dmin * mn         d * sc           -dmin * mn   (6-bit sc, mn)
    Q5_K   5     32     d * sc * q - dmin * mn         d * sc           -dmin * mn   (6-bit sc, mn)
    Q6_K   6     16     d * sc * (q - 32)  (sc int8)   d * sc           -32 scale
    Q1_0   2     128    bit ? d : -d  (1 bit a weight)  2 d              -d       (codes 0, 1)

d, dmin and m are float16 in the block; the products above are exact in float32 except Q6_K's
(scale * code can need 25 bits), so `dequantize()` equals ggml's values to float32 rounding.
Q1_0 (1-bit sign models, weight j of a block in bit j % 8 of byte j / 8) is held as 2-bit codes:
no backend has a 1-bit layout, so it takes 2 bits a weight or more in memory (said in one log line).
The codebook and float-4 types (IQ1..IQ4, TQ1_0/TQ2_0, MXFP4, NVFP4) are exact affine codes too,
only wider than in the file: quant/gguf_decoded.py.
F32/F16/BF16 tensors come back as plain numpy arrays (F16 kept as float16, BF16 widened to float32).
The block layouts follow ggml's `block_q*` structs (ggml-common.h); QK_K = 256.
"""

from __future__ import annotations

import numpy as np

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.gguf_decoded import DECODED, decoded_to_weight
from lantern.app.models.spec import UnsupportedModelError

QK_K = 256

# type -> (weights per block, bytes per block)
BLOCK_LAYOUT: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (QK_K, 84),
    "Q3_K": (QK_K, 110),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
    "Q1_0": (128, 18),
}
PLAIN_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = (*PLAIN_TYPES, *BLOCK_LAYOUT, *DECODED)


def gguf_to_weight(qtype_name: str, raw: np.ndarray, rows: int, cols: int) -> AffineWeight | np.ndarray:
    """One GGUF tensor as an `AffineWeight` [rows, cols] (block types) or a plain numpy array.

    `raw` is the tensor's data as gguf.GGUFReader / read_gguf_index shape it (uint8 blocks, or a
    typed view for F32/F16); rows = output features, cols = input features (GGUF dims reversed).
    A plain tensor whose `raw` is 1-D (norm weights, biases) comes back 1-D.
    Raises UnsupportedModelError for the types not listed in SUPPORTED_TYPES (Q8_K, I8, F64...).
    """
    name = getattr(qtype_name, "name", qtype_name)  # a gguf.GGMLQuantizationType works too
    if name in PLAIN_TYPES:
        return _plain(name, raw, rows, cols)
    if name not in BLOCK_LAYOUT and name not in DECODED:
        raise UnsupportedModelError(
            f"GGUF tensor type {name} is not supported; supported types: {', '.join(SUPPORTED_TYPES)}"
        )
    per_block, nbytes = block_layout(name)
    if cols % per_block:
        raise ValueError(f"GGUF {name}: {cols} columns are not a whole number of {per_block}-weight blocks")
    data = np.ascontiguousarray(raw).view(np.uint8)
    n_blocks = rows * cols // per_block
    if data.size != n_blocks * nbytes:
        raise ValueError(f"GGUF {name}: {data.size} bytes for a [{rows}, {cols}] tensor, expected {n_blocks * nbytes}")
    if name in DECODED:
        return decoded_to_weight(name, data, rows, cols)
    codes, scales, biases, bits, group = _CONVERT[name](data.reshape(n_blocks, nbytes))
    return AffineWeight(
        codes.reshape(rows, cols),
        scales.reshape(rows, cols // group),
        biases.reshape(rows, cols // group),
        bits,
        group,
        f"GGUF {name}",
    )


def block_layout(qtype: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a supported block type."""
    if qtype in BLOCK_LAYOUT:
        return BLOCK_LAYOUT[qtype]
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


def _plain(name: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    shape = (cols,) if raw.ndim == 1 else (rows, cols)
    if name == "F32":
        return np.array(raw.view(np.float32) if raw.dtype == np.uint8 else raw, dtype=np.float32).reshape(shape)
    if name == "F16":
        return np.array(raw.view(np.float16) if raw.dtype == np.uint8 else raw, dtype=np.float16).reshape(shape)
    # BF16 is the top half of a float32: widen the 16 bits into the high half of a 32-bit word.
    bits16 = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32)
    return (bits16 << np.uint32(16)).view(np.float32).reshape(shape)


# ---- helpers over [n_blocks, bytes] arrays ------------------------------------------------------------
def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 [n_blocks, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """Split bytes into 4-bit codes: per run of `width` bytes, the low nibbles give `width` weights
    and the high nibbles the next `width` (ggml's order for every 4-bit-based block)."""
    n, size = qs.shape
    q = qs.reshape(n, size // width, 1, width)
    out = np.empty((n, size // width, 2, width), dtype=np.uint8)
    np.bitwise_and(q[:, :, 0], 0x0F, out=out[:, :, 0])
    np.right_shift(q[:, :, 0], 4, out=out[:, :, 1])
    return out.reshape(n, 2 * size)


def _crumbs(qs: np.ndarray, width: int) -> np.ndarray:
    """Split bytes into 2-bit codes: per run of `width` bytes, bits 0-1 give `width` weights, then
    bits 2-3, 4-5, 6-7 (Q2_K's and Q3_K's order)."""
    n, size = qs.shape
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (qs.reshape(n, size // width, 1, width) >> shifts) & np.uint8(3)
    return q.reshape(n, 4 * size)


def _bit_planes(mask: np.ndarray) -> np.ndarray:
    """Bit b of byte j is weight b * len + j (the K-quants' high-bit masks): [n, len] -> [n, 8 * len]."""
    n, size = mask.shape
    bits = np.unpackbits(mask, axis=1, bitorder="little").reshape(n, size, 8)
    return np.ascontiguousarray(bits.transpose(0, 2, 1)).reshape(n, 8 * size)


def _kquant_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins. Bytes 0-3 hold scales 0-3 (low 6
    bits), bytes 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins
    4-7 (high nibble), whose top 2 bits are the spare top bits of bytes 0-3 and 4-7."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


# ---- one converter per type: blocks -> (codes [n, per_block], scales [n, groups], biases, bits, g) ----
def _q4_0(b: np.ndarray):
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18], 16), d, -8.0 * d, 4, 32


def _q4_1(b: np.ndarray):
    return _nibbles(b[:, 4:20], 16), _f16(b, 0), _f16(b, 2), 4, 32


def _q5(b: np.ndarray, qh_at: int) -> np.ndarray:
    # qh is a little-endian uint32 whose bit j is the 5th bit of weight j.
    high = np.unpackbits(b[:, qh_at : qh_at + 4], axis=1, bitorder="little")
    return _nibbles(b[:, qh_at + 4 : qh_at + 20], 16) | (high << 4)


def _q5_0(b: np.ndarray):
    d = _f16(b, 0)
    return _q5(b, 2), d, -16.0 * d, 5, 32


def _q5_1(b: np.ndarray):
    return _q5(b, 4), _f16(b, 0), _f16(b, 2), 5, 32


def _q8_0(b: np.ndarray):
    d = _f16(b, 0)
    return b[:, 2:34] ^ np.uint8(0x80), d, -128.0 * d, 8, 32  # int8 q -> q + 128 as a byte


def _q2_k(b: np.ndarray):
    # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    sc = b[:, 0:16]
    scale = _f16(b, 80) * (sc & 0x0F).astype(np.float32)
    bias = -(_f16(b, 82) * (sc >> 4).astype(np.float32))
    return _crumbs(b[:, 16:80], 32), scale, bias, 2, 16


def _q3_k(b: np.ndarray):
    # hmask[32], qs[64], scales[12] (16 six-bit values, stored with an offset of 32), d
    s = b[:, 96:108]
    low = (s[:, 0:8].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    high = (s[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)) & 0x03
    sc = (low.reshape(-1, 16) | (high.reshape(-1, 16) << 4)).astype(np.float32) - 32.0
    scale = _f16(b, 108) * sc
    codes = _crumbs(b[:, 32:96], 32) | (_bit_planes(b[:, 0:32]) << 2)
    return codes, scale, -4.0 * scale, 3, 16


def _q4_k(b: np.ndarray):
    # d, dmin, scales[12], qs[128]
    sc, mn = _kquant_scale_min(b[:, 4:16])
    return _nibbles(b[:, 16:144], 32), _f16(b, 0) * sc, -(_f16(b, 2) * mn), 4, 32


def _q5_k(b: np.ndarray):
    # d, dmin, scales[12], qh[32], qs[128]
    sc, mn = _kquant_scale_min(b[:, 4:16])
    codes = _nibbles(b[:, 48:176], 32) | (_bit_planes(b[:, 16:48]) << 4)
    return codes, _f16(b, 0) * sc, -(_f16(b, 2) * mn), 5, 32


def _q6_k(b: np.ndarray):
    # ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d
    codes = _nibbles(b[:, 0:128], 64) | (_crumbs(b[:, 128:192], 32) << 4)
    scale = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)
    return codes, scale, -32.0 * scale, 6, 16


def _q1_0(b: np.ndarray):
    # d, then 16 bytes of signs: bit set -> +d, clear -> -d
    d = _f16(b, 0)
    return np.unpackbits(b[:, 2:18], axis=1, bitorder="little"), 2.0 * d, -d, 2, 128


_CONVERT = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q1_0": _q1_0,
}
