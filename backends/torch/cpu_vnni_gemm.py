"""Quantized GEMMs on int8 dot products (AVX512-VNNI) for CPU decode steps: kernels/cpu_vnni_gemm.c.

aten's int4/int8 CPU kernels widen every weight to float and compute in float32: at one row they
read the weights slower than memory allows, and batched they sit at the float32 FMA roof. These
kernels quantize x per row and per 32 columns in two int8 levels (x ~ d * (x1 + x2 / 256), d =
max|x| / 127) and multiply both with the weight's 4- or 8-bit codes in integer dot products (64
multiply-adds per instruction), then apply the groups' scales and biases in float32. One level
(llama.cpp's q8 scheme) costs ~1% per product on real activations, enough to change SmolLM2 Q4_1's
greedy answers (llama.cpp's own answer to "What is the capital of France?" is "L'Etoile, la
Marseillaise,"); two leave ~15 bits, closer to the exact product than aten's bf16 activations.
SmolLM2 Q4_1 decode steps on a 2-core EPYC (AVX512-VNNI, bf16, --compile): 32 rows ~47 -> ~35 ms,
one row ~7.0-7.3 -> ~6.3-6.5 ms.

One kernel serves every row count a decode step has, and each row is computed alone (threads split
the outputs), so a row's result does not depend on how many rows share its step. The weight layout
(`pack_codes`, `pack_scales`) and its decoders (`decode_rows`, `decode_block_rows`) live here too:
the layer (vnni_linear.VnniLinear) keeps only this layout. Built on first use by native_build for
x86-64 CPUs with AVX512-VNNI; elsewhere the quantized layers keep aten's kernels (quant_linear).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from lantern.app.models.quant.affine import AffineWeight, map_codes
from lantern.backends.torch import native_build

XG = 32  # x's quantization group: K must be a multiple of it, and the weight's group a multiple too
BLOCK = 16  # outputs per block of the layout (one vector of int32 lanes)
IO_DTYPES = (torch.float32, torch.bfloat16)
_F16_TOP = 14  # scales and biases are brought below 2**14 (float16's largest is 65504)


@functools.cache
def available() -> bool:
    """Whether the VNNI kernels serve quantized layers in this process (torch.ops.lantern.vnni_mm,
    built from kernels/cpu_ops.cpp on first use)."""
    ok = native_build.load_ops(
        "cpu_ops.cpp",
        "quantized layers use aten's int4/int8 kernels",
        extra_flags=("-mavx512vnni", "-mf16c"),
        needs=("avx512_vnni", "f16c"),
        avx2=True,  # kernels/cpu_vnni_gemm_avx2.c: the same results on AVX2 CPUs
    )
    if ok:  # the fake implementations (shapes only) let compiled graphs trace the ops
        torch.library.register_fake("lantern::vnni_mm", _fake)
        torch.library.register_fake("lantern::vnni_mm_codebook", _fake)
    return ok


def vnni_mm(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    out_scale: torch.Tensor,
    group_size: int,
    n: int,
    bits: int,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] float32 or bfloat16 @ W.T -> [M, n] in x's dtype, W held as `pack_codes` /
    `pack_scales` made it (out_scale: a one-element float32 tensor, so that layers differing in it
    share a compiled graph; table: a `codebook`'s 16 codes, with 4-bit indices). Requires available()."""
    if table is None:
        return torch.ops.lantern.vnni_mm(x, codes, scales, out_scale, group_size, n, bits)
    return torch.ops.lantern.vnni_mm_codebook(x, codes, scales, out_scale, group_size, n, bits, table)


def _fake(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    s: torch.Tensor,
    g: int,
    n: int,
    bits: int,
    table: torch.Tensor | None = None,
):
    return x.new_empty((x.shape[0], n))


# ---- the layout -------------------------------------------------------------------------------------------
def pack_codes(codes: np.ndarray, bits: int) -> torch.Tensor:
    """uint8 codes [N, K] (< 2**bits) in the kernel's layout: [N/16][K/8][64] for 4 bits (byte t of
    lane i: column 8j + t in the low nibble, 8j + 4 + t in the high one), [N/16][K/4][64] for 8.
    Rows are padded to a multiple of 16 with code 0 (their scales are 0). Converted a few MB at a
    time, so loading holds little beyond the result."""
    n, k = codes.shape
    blocks = -(-n // BLOCK)
    per_vector = 8 if bits == 4 else 4
    out = np.empty((blocks, k // per_vector, 64), np.uint8)
    step = max(BLOCK, (1 << 22) // max(k, 1) // BLOCK * BLOCK)
    for r in range(0, blocks * BLOCK, step):
        c = np.asarray(codes[r : r + step], np.uint8)
        if c.shape[0] % BLOCK:
            c = np.concatenate([c, np.zeros((BLOCK - c.shape[0] % BLOCK, k), np.uint8)])
        nb = c.shape[0] // BLOCK
        dest = out[r // BLOCK : r // BLOCK + nb]
        if bits == 4:
            v = c.reshape(nb, BLOCK, k // 8, 2, 4).transpose(0, 2, 1, 3, 4)
            dest[:] = (v[..., 0, :] | (v[..., 1, :] << 4)).reshape(nb, k // 8, 64)
        else:
            dest[:] = c.reshape(nb, BLOCK, k // 4, 4).transpose(0, 2, 1, 3).reshape(nb, k // 4, 64)
    return torch.from_numpy(out)


def codebook(w: AffineWeight) -> tuple[np.ndarray, np.ndarray] | None:
    """(uint8 indices [N, K] < 16, uint8 table [16]) when w's codes take at most 16 values, so that
    table[indices] are its codes (GGUF's IQ4, IQ3, IQ2, IQ1 and MXFP4 tensors, bitsandbytes' nf4/fp4,
    held as 5- or 8-bit codes): the kernel then reads 4 bits per weight instead of 8, with the same
    scales. A group whose scale and bias are both 0 is 0 whatever its codes (IQ4_XS's zero sub-block
    scale): its codes do not count. None otherwise."""
    dont_care = (w.scales == 0) & (w.biases == 0)
    rows, groups = w.scales.shape
    step = max(1, (1 << 20) // w.codes.shape[1])  # a few MB at a time: np.bincount widens to int64
    seen = np.zeros(256, bool)
    for r in range(0, rows, step):
        part, skip = w.codes[r : r + step], dont_care[r : r + step]
        if skip.any():
            part = part.reshape(-1, groups, w.group_size)[~skip]
        seen |= np.bincount(part.reshape(-1), minlength=256) > 0
        if np.count_nonzero(seen) > 16:
            return None  # a Q8_0 tensor: after its first rows
    used = np.flatnonzero(seen)
    if used.size == 0:
        return None
    table = np.full(16, used[0], np.uint8)
    table[: len(used)] = used
    index = np.zeros(256, np.uint8)  # a code outside the table (a don't-care group's) reads entry 0
    index[used] = np.arange(len(used), dtype=np.uint8)
    return map_codes(index, w.codes), table


def pack_scales(scales: np.ndarray, biases: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(float16 [N/16][K/g][2][16] scales then biases per block, out_scale): the values are multiplied
    by a power of two that brings the largest below 2**14 (float16's range), and out_scale undoes it
    (exactly: the kernel folds it into x's scales)."""
    n, groups = scales.shape
    top = float(max(np.abs(scales).max(initial=0.0), np.abs(biases).max(initial=0.0)))
    shift = _F16_TOP - math.ceil(math.log2(top)) if top > 0 and math.isfinite(top) else 0
    blocks = -(-n // BLOCK)
    out = np.zeros((blocks * BLOCK, groups, 2), np.float32)
    out[:n, :, 0] = scales
    out[:n, :, 1] = biases
    out = np.ldexp(out, shift).astype(np.float16)  # [N_pad, K/g, 2]
    packed = out.reshape(blocks, BLOCK, groups, 2).transpose(0, 2, 3, 1)
    return torch.from_numpy(np.ascontiguousarray(packed)), torch.tensor([math.ldexp(1.0, -shift)])


def decode_rows(
    codes: torch.Tensor,
    scales: torch.Tensor,
    out_scale: torch.Tensor,
    ids: torch.Tensor,
    k: int,
    g: int,
    bits: int,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """float32 rows `ids` [T] of a packed weight: [T, K] (a quantized embedding's lookup)."""
    blk, lane = ids // BLOCK, ids % BLOCK
    if bits == 4:
        b = codes.view(-1, k // 8, BLOCK, 4)[blk, :, lane, :]  # [T, K/8, 4]
        q = torch.stack((b & 15, b >> 4), dim=2)  # [T, K/8, 2, 4]
        if table is not None:
            q = table[q.long()]
    else:
        q = codes.view(-1, k // 4, BLOCK, 4)[blk, :, lane, :]  # [T, K/4, 4]
    sb = scales[blk, :, :, lane].float()  # [T, K/g, 2]
    w = q.reshape(ids.shape[0], k // g, g).float() * sb[..., :1] + sb[..., 1:]
    return w.mul_(out_scale).view(ids.shape[0], k)


def decode_block_rows(
    codes: torch.Tensor,
    scales: torch.Tensor,
    out_scale: torch.Tensor,
    start: int,
    stop: int,
    k: int,
    g: int,
    bits: int,
    dtype: torch.dtype = torch.float32,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows start..stop (start a multiple of 16) of a packed weight in `dtype`, as a [rows, K] view of
    a contiguous [K, rows] tensor: the layout runs along K within a block, so writing column-major
    reads it in place (the dense prefill path's GEMM takes W.T without a copy). One pass of the native
    op (torch.ops.lantern.vnni_decode: each weight computed in float32, rounded once into float32 or
    bfloat16; other dtypes converted from float32), the values decode_rows gives. Requires available()."""
    first, last = start // BLOCK, -(-stop // BLOCK)
    native = dtype if dtype in IO_DTYPES else torch.float32
    args = (codes, scales, out_scale, k, g, bits, first, last - first, native)
    if table is None:
        cols = torch.ops.lantern.vnni_decode(*args)
    else:
        cols = torch.ops.lantern.vnni_decode_codebook(*args, table)
    return cols.to(dtype)[:, start - first * BLOCK : stop - first * BLOCK].t()
