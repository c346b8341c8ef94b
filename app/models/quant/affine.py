"""The one backend-neutral form of a quantized weight, and the arithmetic every format shares.

Every quantized checkpoint (GGUF blocks, MLX-community folders, AWQ, GPTQ, `--isq`) is first
read into an `AffineWeight`: unpacked integer codes with one scale and one bias per group of
`group_size` consecutive input columns, so that

    w[o, i] = codes[o, i] * scales[o, i // group_size] + biases[o, i // group_size]

This is exact for every format those files use (a symmetric format is affine with
bias = -zero_point * scale). GPTQ act-order files group input columns out of order: they are held
with the columns sorted into contiguous groups and `perm` saying which input each stored column
multiplies (the layer gathers x[..., perm] first), so they stay exact too.

Each backend then packs it into its own kernel layout, converting to the nearest mode it has when
the file's mode is not one of them (`requantize`, error measured).
FP8 checkpoints are an `Fp8Weight` (raw e4m3 bytes with per-tensor or block scales).

Codes are held unpacked (one uint8 per weight) only while one tensor is being converted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class AffineWeight:
    codes: np.ndarray  # uint8 [rows, cols], each < 2**bits
    scales: np.ndarray  # float32 [rows, cols // group_size]
    biases: np.ndarray  # float32 [rows, cols // group_size]
    bits: int
    group_size: int
    source: str  # where it came from, for log lines: "GGUF Q4_K", "AWQ 4-bit g128", "ISQ q4"
    # int32 [cols] or None: stored column j multiplies input column perm[j] (GPTQ act-order). Layers
    # that honour it compute W_stored @ x[..., perm]; `dequantize` returns the input-order matrix.
    perm: np.ndarray | None = None
    # The layer quantizes its input to this many bits per token first (symmetric, by each row's absolute
    # maximum: round(x * q / max|x|) * max|x| / q, q = 2**(bits - 1) - 1): BitNet b1.58's W1.58A8. None: x as is.
    act_bits: int | None = None

    def __post_init__(self) -> None:
        rows, cols = self.codes.shape
        if self.perm is not None and self.perm.shape != (cols,):
            raise ValueError(f"{self.source}: input permutation {self.perm.shape} does not fit {cols} columns")
        if cols % self.group_size or self.scales.shape != (rows, cols // self.group_size):
            raise ValueError(
                f"{self.source}: codes {self.codes.shape} do not match scales {self.scales.shape} "
                f"for group size {self.group_size}"
            )
        if self.biases.shape != self.scales.shape:
            raise ValueError(f"{self.source}: biases {self.biases.shape} differ from scales {self.scales.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape  # type: ignore[return-value]

    @property
    def mode(self) -> tuple[int, int]:
        return self.bits, self.group_size

    def dequantize(self, dtype: np.dtype | type = np.float32) -> np.ndarray:
        """The matrix in input-column order (a permuted weight's columns put back)."""
        rows, cols = self.codes.shape
        g = self.group_size
        w = self.codes.reshape(rows, cols // g, g).astype(np.float32)
        w *= self.scales[:, :, None]
        w += self.biases[:, :, None]
        w = w.reshape(rows, cols)
        if self.perm is not None:
            ordered = np.empty_like(w)
            ordered[:, self.perm] = w
            w = ordered
        return w.astype(dtype, copy=False)

    def stored(self) -> AffineWeight:
        """The stored columns as a plain weight (no permutation): what a layer packs when it gathers
        x[..., perm] itself."""
        return replace(self, perm=None)

    def rows(self, start: int, end: int) -> AffineWeight:
        return replace(self, codes=self.codes[start:end], scales=self.scales[start:end], biases=self.biases[start:end])

    def cols(self, start: int, end: int) -> AffineWeight:
        """Input columns [start, end); both must fall on group boundaries (tensor-parallel rows).
        A per-channel weight (one group per row) keeps its scales over the narrower rows."""
        g = self.group_size
        if self.perm is not None:
            raise ValueError(f"{self.source}: act-order columns are permuted; a column range is not a group range")
        if g == self.codes.shape[1]:
            return replace(self, codes=self.codes[:, start:end], group_size=end - start)
        if start % g or end % g:
            raise ValueError(f"{self.source}: columns {start}:{end} split a quantization group of {g}")
        return replace(
            self,
            codes=self.codes[:, start:end],
            scales=self.scales[:, start // g : end // g],
            biases=self.biases[:, start // g : end // g],
        )

    def map_rows(self, fn) -> AffineWeight:
        """Apply one row permutation (e.g. llama.cpp's q/k un-permute) to codes, scales and biases."""
        return replace(self, codes=fn(self.codes), scales=fn(self.scales), biases=fn(self.biases))


def regroup(w: AffineWeight, groups: tuple[int, ...]) -> AffineWeight | None:
    """`w` with a group size from `groups` (largest first), exactly: a group that is a multiple of
    a supported one repeats its scale and bias; None when none divides it (group 16)."""
    if w.group_size in groups:
        return w
    for g in groups:
        if w.group_size % g == 0:
            f = w.group_size // g
            scales, biases = np.repeat(w.scales, f, axis=1), np.repeat(w.biases, f, axis=1)
            return replace(w, scales=scales, biases=biases, group_size=g)
    return None


@dataclass
class Fp8Weight:
    """An FP8 (e4m3fn) weight: raw bytes and the scale(s) that multiply them.

    `scale` is a scalar (per-tensor), [rows, 1] (per output channel) or [rows / b0, cols / b1] for
    block-wise scales (`block` = (b0, b1), as DeepSeek-V3 and Qwen3-FP8 ship with 128x128).
    """

    data: np.ndarray  # uint8 [rows, cols], e4m3fn bit patterns
    scale: np.ndarray  # float32
    block: tuple[int, int] | None
    source: str

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape  # type: ignore[return-value]

    def rows(self, start: int, end: int) -> Fp8Weight:
        return self._slice(0, start, end)

    def cols(self, start: int, end: int) -> Fp8Weight:
        return self._slice(1, start, end)

    def _slice(self, axis: int, start: int, end: int) -> Fp8Weight:
        """A tensor-parallel shard; block scales must not be cut (ValueError: the caller dequantizes)."""
        index = (slice(start, end), slice(None)) if axis == 0 else (slice(None), slice(start, end))
        scale = self.scale
        if self.block is not None:
            b = self.block[axis]
            if start % b or (end % b and end != self.data.shape[axis]):
                raise ValueError(f"{self.source}: a shard {start}:{end} cuts its {b}-wide scale blocks")
            scale = scale[
                (slice(start // b, -(-end // b)),) if axis == 0 else (slice(None), slice(start // b, -(-end // b)))
            ]
        elif axis == 0 and scale.size > 1:  # per output channel
            scale = scale.reshape(-1, 1)[start:end]
        return replace(self, data=self.data[index], scale=scale)

    def dequantize(self, dtype: np.dtype | type = np.float32) -> np.ndarray:
        w = E4M3_VALUES[self.data]
        if self.block is None:
            w *= np.asarray(self.scale, dtype=np.float32).reshape(-1, 1) if self.scale.size > 1 else self.scale
        else:
            b0, b1 = self.block
            s = np.repeat(np.repeat(self.scale, b0, axis=0), b1, axis=1)
            w *= s[: w.shape[0], : w.shape[1]]
        return w.astype(dtype, copy=False)


def _e4m3fn_table() -> np.ndarray:
    """The 256 values of float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
    infinities, 0x7F and 0xFF are NaN), as float32."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7)
    subnormal = (man / 8.0) * 2.0**-6
    vals = sign * np.where(exp == 0, subnormal, normal)
    vals[(b & 0x7F) == 0x7F] = np.nan
    return vals.astype(np.float32)


E4M3_VALUES = _e4m3fn_table()


# ---- packing: MLX's layout, also the layout of MLX-community checkpoints --------------------------
def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes [rows, cols] into uint32 [rows, cols * bits / 32] as one little-endian bit stream
    per row: code j occupies bits j*bits .. j*bits+bits-1 (MLX's affine layout, every width)."""
    rows, cols = codes.shape
    if (cols * bits) % 32:
        raise ValueError(f"{cols} columns of {bits}-bit codes do not fill whole 32-bit words")
    out = np.empty((rows, cols * bits // 32), dtype=np.uint32)
    step = max(1, (1 << 22) // max(cols * bits, 1))  # bound the temporaries to a few MiB
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
        for r in range(0, rows, step):
            c = codes[r : r + step].reshape(-1, cols // per, per).astype(np.uint32)
            out[r : r + step] = np.bitwise_or.reduce(c << shifts, axis=-1)
        return out
    for r in range(0, rows, step):
        chunk = codes[r : r + step]
        stream = np.zeros((chunk.shape[0], cols, bits), dtype=np.uint8)
        for i in range(bits):
            stream[:, :, i] = (chunk >> i) & 1
        packed = np.packbits(stream.reshape(chunk.shape[0], -1, 8), axis=-1, bitorder="little")
        out[r : r + step] = packed.reshape(chunk.shape[0], -1).view(np.uint32)
    return out


def unpack_bits(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The inverse of pack_bits: uint32 [rows, cols * bits / 32] -> uint8 codes [rows, cols]."""
    rows = packed.shape[0]
    packed = np.ascontiguousarray(packed, dtype=np.uint32)
    out = np.empty((rows, cols), dtype=np.uint8)
    step = max(1, (1 << 22) // max(cols * bits, 1))  # bound the temporaries to a few MiB
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
        for r in range(0, rows, step):
            c = (packed[r : r + step, :, None] >> shifts) & np.uint32((1 << bits) - 1)
            out[r : r + step] = c.reshape(c.shape[0], -1)[:, :cols]
        return out
    weights = (1 << np.arange(bits, dtype=np.uint8))[None, None, :]
    for r in range(0, rows, step):
        chunk = packed[r : r + step]
        stream = np.unpackbits(chunk.view(np.uint8), axis=-1, bitorder="little")
        stream = stream[:, : cols * bits].reshape(chunk.shape[0], cols, bits)
        out[r : r + step] = (stream * weights).sum(axis=-1, dtype=np.uint8)
    return out


# ---- quantizing and changing modes -----------------------------------------------------------------
def map_codes(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """table[codes] for uint8 codes (table: 256 or fewer uint8 entries covering them), a few MB at a
    time: numpy's fancy indexing widens the indices to int64, 8x the codes for a whole tensor."""
    out = np.empty(codes.shape, np.uint8)
    flat_in, flat_out = codes.reshape(-1), out.reshape(-1)
    for i in range(0, flat_in.size, _MAP_CHUNK):
        flat_out[i : i + _MAP_CHUNK] = table[flat_in[i : i + _MAP_CHUNK]]
    return out


_MAP_CHUNK = 1 << 20


def quantize_affine(
    w: np.ndarray, bits: int, group_size: int, *, symmetric: bool = False, source: str = ""
) -> AffineWeight:
    """Round-to-nearest quantization of a float matrix, one scale and bias per group.

    Asymmetric: the group's [min, max] spans the codes (as Q4_1 and MLX do). Symmetric: codes are
    centred on 2**(bits-1) and the scale is absmax / (2**(bits-1) - 1), which is what per-channel
    int8 kernels need (bias = -2**(bits-1) * scale). group_size may equal the column count
    (per-channel). `w` may be any array-like with rows (a torch or MLX tensor too): it is read
    and converted in row chunks, so no float32 copy of a whole large matrix is made.
    """
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"{cols} columns are not a multiple of the group size {group_size}")
    codes = np.empty((rows, cols), np.uint8)
    scales = np.empty((rows, cols // group_size), np.float32)
    biases = np.empty((rows, cols // group_size), np.float32)
    step = max(1, (1 << 20) // max(cols, 1))  # ~4 MiB of float32 temporaries at a time
    for r in range(0, rows, step):
        chunk = float32_array(w[r : r + step]).reshape(-1, cols // group_size, group_size)
        c, s, b = _round_groups(chunk, bits, symmetric)
        codes[r : r + step], scales[r : r + step], biases[r : r + step] = c.reshape(-1, cols), s, b
    return AffineWeight(codes, scales, biases, bits, group_size, source or f"{bits}-bit g{group_size}")


def float32_array(rows: object) -> np.ndarray:
    """A float tensor of numpy, torch or MLX as float32 numpy."""
    if isinstance(rows, np.ndarray):
        return rows.astype(np.float32, copy=False)
    if type(rows).__module__.startswith("torch"):
        return rows.float().numpy()  # type: ignore[attr-defined]
    if type(rows).__module__.startswith("mlx"):
        import mlx.core as mx

        return np.array(rows.astype(mx.float32))  # type: ignore[attr-defined]
    return np.asarray(rows, dtype=np.float32)


def _round_groups(g: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    levels = (1 << bits) - 1
    if symmetric:
        half = 1 << (bits - 1)
        scales = np.abs(g).max(axis=-1) / (half - 1)
        scales[scales == 0] = 1.0
        codes = np.clip(np.rint(g / scales[..., None]) + half, 0, levels)
        biases = -half * scales
    else:
        lo, hi = g.min(axis=-1), g.max(axis=-1)
        scales = (hi - lo) / levels
        scales[scales == 0] = 1.0
        codes = np.clip(np.rint((g - lo[..., None]) / scales[..., None]), 0, levels)
        biases = lo
    return codes.astype(np.uint8), scales.astype(np.float32), biases.astype(np.float32)


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact|| / ||exact|| (Frobenius); 0 for an all-zero exact."""
    denom = float(np.linalg.norm(exact))
    return float(np.linalg.norm(approx - exact)) / denom if denom else 0.0


def requantize(w: AffineWeight, bits: int, group_size: int, *, symmetric: bool = False) -> tuple[AffineWeight, float]:
    """`w` in another mode, and the relative error that costs against `w`'s own values.

    group_size 0 means one group per row (per-channel). Works through row chunks, so a large
    embedding never exists in float32 all at once. A permuted (act-order) weight comes out in input
    order without its permutation (`in_input_order`); layers requantize `w.stored()` to keep it."""
    rows, cols = w.shape
    g = group_size or cols
    codes = np.empty((rows, cols), np.uint8)
    scales = np.empty((rows, cols // g), np.float32)
    biases = np.empty((rows, cols // g), np.float32)
    diff2 = norm2 = 0.0
    step = max(1, (1 << 20) // max(cols, 1))  # ~4 MiB of float32 per chunk
    for r in range(0, rows, step):
        exact = w.rows(r, r + step).dequantize()
        part = quantize_affine(exact, bits, g, symmetric=symmetric)
        codes[r : r + step], scales[r : r + step], biases[r : r + step] = part.codes, part.scales, part.biases
        diff2 += float(np.square(part.dequantize() - exact, dtype=np.float64).sum())
        norm2 += float(np.square(exact, dtype=np.float64).sum())
    out = AffineWeight(codes, scales, biases, bits, g, f"{w.source} as {bits}-bit g{g}")
    return out, (diff2 / norm2) ** 0.5 if norm2 else 0.0


def in_input_order(w: AffineWeight, errors: ErrorLog, where: str) -> AffineWeight:
    """An act-order weight for a place that cannot gather its input (stacked MoE experts, a tensor-
    parallel split of input columns): requantized in input order to 8 bits, the error logged."""
    if w.perm is None:
        return w
    out, err = requantize(w, 8, w.group_size)
    errors.add(w.source, f"8-bit g{w.group_size} in input order ({where})", err)
    return out


def same_perm(parts: list[AffineWeight]) -> bool:
    """True when the parts gather their input alike (so they stack into one matrix)."""
    first = parts[0].perm
    return all((p.perm is None) == (first is None) for p in parts) and (
        first is None or all(np.array_equal(p.perm, first) for p in parts)
    )


def concat_rows(parts: list[AffineWeight]) -> AffineWeight:
    """Stack weights of one mode and one input permutation along the output axis (fused q/k/v or gate/up)."""
    first = parts[0]
    if any(p.mode != first.mode for p in parts):
        raise ValueError("cannot stack quantized weights of different modes: " + ", ".join(p.source for p in parts))
    if not same_perm(parts):
        raise ValueError("cannot stack act-order weights whose input permutations differ")
    if len({p.act_bits for p in parts}) > 1:
        raise ValueError(
            "cannot stack weights whose inputs are quantized differently: " + ", ".join(p.source for p in parts)
        )
    return replace(
        first,
        codes=np.concatenate([p.codes for p in parts]),
        scales=np.concatenate([p.scales for p in parts]),
        biases=np.concatenate([p.biases for p in parts]),
        source=first.source if all(p.source == first.source for p in parts) else "mixed",
    )


def fp8_as_affine(w: Fp8Weight, bits: int, group_size: int, symmetric: bool = False) -> tuple[AffineWeight, float]:
    """An FP8 weight requantized to affine codes (for a backend with no FP8 layout; group_size 0: one
    group a row), a few MB of rows at a time, and the relative error that costs against its e4m3 values."""
    rows, cols = w.shape
    group_size = group_size or cols
    step = max(1, (1 << 20) // max(cols, 1))
    if w.block is not None:  # whole row blocks per chunk: block scales are sliced with them
        step = max(w.block[0], step // w.block[0] * w.block[0])
    codes = np.empty((rows, cols), np.uint8)
    scales = np.empty((rows, cols // group_size), np.float32)
    biases = np.empty_like(scales)
    diff2 = norm2 = 0.0
    for r in range(0, rows, step):
        exact = w.rows(r, min(rows, r + step)).dequantize(np.float32)
        part = quantize_affine(exact, bits, group_size, symmetric=symmetric)
        codes[r : r + step], scales[r : r + step], biases[r : r + step] = part.codes, part.scales, part.biases
        diff2 += float(np.square(part.dequantize() - exact, dtype=np.float64).sum())
        norm2 += float(np.square(exact, dtype=np.float64).sum())
    out = AffineWeight(codes, scales, biases, bits, group_size, w.source)
    return out, (diff2 / norm2) ** 0.5 if norm2 else 0.0


def concat_fp8_rows(parts: list[Fp8Weight]) -> Fp8Weight | None:
    """FP8 weights stacked along the output axis (fused q/k/v or gate/up), or None where their scales
    do not stack: per-tensor and per-channel scales become per-channel ones; block scales stack when
    every part but the last fills whole row blocks of one block shape."""
    first = parts[0]
    source = first.source if all(p.source == first.source for p in parts) else "mixed"
    if any(p.shape[1] != first.shape[1] for p in parts):
        return None
    if all(p.block is None for p in parts):
        if any(np.asarray(p.scale).size not in (1, p.shape[0]) for p in parts):
            return None
        scales = [np.broadcast_to(np.asarray(p.scale, np.float32).reshape(-1, 1), (p.shape[0], 1)) for p in parts]
        data = np.concatenate([p.data for p in parts])
        return Fp8Weight(data, np.ascontiguousarray(np.concatenate(scales)), None, source)
    block = first.block
    if any(p.block != block for p in parts) or any(p.shape[0] % block[0] for p in parts[:-1]):
        return None
    data = np.concatenate([p.data for p in parts])
    return Fp8Weight(data, np.concatenate([np.asarray(p.scale, np.float32) for p in parts]), block, source)


class ErrorLog:
    """Collects requantization errors per (from, to) mode and logs one line for each at the end,
    instead of one per tensor."""

    def __init__(self) -> None:
        self.worst: dict[tuple[str, str], tuple[float, int]] = {}
        self.notes: dict[str, None] = {}  # other one-line facts about this load, said once each

    def note(self, message: str) -> None:
        self.notes[message] = None

    def add(self, source: str, target: str, error: float) -> None:
        worst, count = self.worst.get((source, target), (0.0, 0))
        self.worst[(source, target)] = (max(worst, error), count + 1)

    def report(self, backend: str) -> None:
        for message in self.notes:
            logger.info("%s", message)
        for (source, target), (worst, count) in sorted(self.worst.items()):
            logger.warning(
                "%s: %d %s tensor(s) have no exact %s layout; converted to %s, relative error up to %.2e",
                backend,
                count,
                source,
                backend,
                target,
                worst,
            )
