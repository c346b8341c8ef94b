"""Triton matmuls on group-quantized weights (4- and 8-bit "packed nibbles"), the torch backend's CUDA path.

w[n, k] = code[n, k] * scales[n, k // g] + biases[n, k // g]; layout in quant_reference.py. The packed
bytes are read as int32 words (8 or 4 codes each, little-endian = column order). Both kernels turn
codes into floats with the exponent trick of `_word_codes` (1 + code / 2^bits: a shift and one LOP3,
no int->float conversion, which runs at a quarter of the FMA rate), and fold the "1 +" into the bias.

- `_gemv_kernel` (decode, M <= GEMV_MAX_M, where triton_gemv_dp4a's int8-activation GEMV does not serve:
  float32 x, float codes, LANTERN_GEMV=float): meant to be bandwidth-bound. Each program owns BLOCK_N output rows and
  streams their words once, 4 KiB per step (two 16-byte loads per thread), prefetching the next step.
  Per group it takes dot(x, f) and applies the affine once -- s * sum(c x) + b * sum(x) =
  (s 2^bits) * sum(f x) + (b - s 2^bits) * sum(x) -- so the inner loop is one FMA per code per row of x.
  Per-(row, group) partial sums are reduced across threads once, after the loop. The rows of x in
  one pass (<= GEMV_MAX_M) share one read of the weights.
- `_gemm_kernel` (prefill, batches): [BLOCK_M, BLOCK_N] tiles; each K step dequantizes a
  [BLOCK_N, BLOCK_K] tile (w = f * (s 2^bits) + (b - s 2^bits): one FMA per weight), rounds it to x's
  dtype and feeds tl.dot with fp32 accumulation (ieee for fp32 inputs, to match the reference).

Float codes share both kernels (`FLOAT_CODE`, no biases: w = value * scale): e2m1 nibbles (fp4:
MXFP4 / NVFP4 checkpoints, FLOAT_CODE 4) and e4m3 bytes (FP8 checkpoints on GPUs without FP8
matmuls, or with block-wise scales, FLOAT_CODE 8). `_word_float` turns each code into its value
times 2^-14 (e2m1) or 2^-8 (e4m3) by placing its bits in a float16 (no table); the power of two
goes into the group scale.

Block sizes come from `_gemv_config` / `_gemm_config`, not @triton.autotune: decode runs under CUDA
graphs, every (shape, batch bucket) would pay a benchmarking pass at start-up, and no GPU was at hand
to choose a config list with. They were chosen by reading the sm_90 SASS that ptxas makes of each
variant (instructions per weight in the loop; no spills), with ~2 programs per SM on a 132-SM
H100/H200 for the GEMV (8 rows per program, fewer for narrow matrices). Timed on an H200 (2026-11-30,
scripts/bench_qgemv.py over 24 configs): 30-46% of HBM on the 8B matrices, as aten's tinygemm, each within ~10%
of the best config; the loop issues ~6.6 instructions a weight (scripts/gemv_sass.py), the limit it meets
(hence triton_gemv_dp4a: 1.9-2.9 a weight).
LANTERN_GEMV_CONFIGS names a sweep's JSON whose winners replace the built-in configs for their shapes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from lantern.backends.torch.kernels import triton_gemv_dp4a
from lantern.backends.torch.kernels.quant_reference import check_mode

logger = logging.getLogger(__name__)

GEMV_MAX_M = 2  # rows of x the GEMV takes in one pass; larger M goes to the GEMM (tensor cores)
_MIN_PROGRAMS = 264  # GEMV: ~2 programs per SM on a 132-SM H100/H200
_GEMM_MIN_PROGRAMS = 128  # small-M GEMM: ~1 (a 4096-row matrix gets 32-row tiles)
_ONE_BITS = 0x3F800000  # float32 1.0


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [N, K] codes -> the packed layout: 4-bit uint8 [N, K/2] (low nibble = even column); 8-bit as is."""
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise ValueError(f"codes must be a 2-D uint8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    if bits == 8:
        return codes.contiguous()
    if bits != 4:
        raise ValueError(f"packed-nibble weights are 4- or 8-bit, not {bits}-bit")
    if codes.shape[1] % 2:
        raise ValueError(f"4-bit packing needs an even number of columns, got {codes.shape[1]}")
    if bool((codes > 15).any()):
        raise ValueError("4-bit codes must be < 16")
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


@triton.jit
def _word_codes(v, one, BITS: tl.constexpr):
    """int32 words [..., W] -> float32 [..., W * 32 / BITS] of 1 + code / 2^BITS, in column order.

    Each code is shifted to the top of a float's mantissa under exponent 0 (one shift and one
    AND-OR per code, exact): no int->float conversion, and 1 + c/2^BITS is then used directly, the
    1 being taken out per group as sum(x) (see _gemv_kernel). `one` is 0x3F800000 (the bits of 1.0)
    passed at run time: with the mask it makes one LOP3 (a & imm | reg); two immediates would take two.
    """
    if BITS == 4:
        # Code i of a word (bits 4i..4i+3) goes to bits 19..22; interleaving puts i in column order.
        e = tl.interleave(
            tl.interleave(tl.interleave(v << 19, v << 3), tl.interleave(v << 11, v >> 5)),
            tl.interleave(tl.interleave(v << 15, v >> 1), tl.interleave(v << 7, v >> 9)),
        )
        return ((e & 0x780000) | one).to(tl.float32, bitcast=True)
    else:
        e = tl.interleave(tl.interleave(v << 15, v >> 1), tl.interleave(v << 7, v >> 9))
        return ((e & 0x7F8000) | one).to(tl.float32, bitcast=True)


@triton.jit
def _word_e2m1(v):
    """int32 words [..., W] of e2m1 codes -> float32 [..., W * 8] of value * 2^-14, in column order.

    A code's exponent and mantissa bits (2..0) go to float16's bits 11..9 -- the bottom of its exponent
    and the top of its mantissa -- and its sign to bit 15: that float16 is the e2m1 value times 2^-14
    exactly, exponent 0 landing in float16's subnormals as it is e2m1's own subnormal (0 and 0.5). The
    conversion to float32 is exact. Code i of a word (bits 4i..4i+3) is shifted to bits 9..12 first.
    """
    e = tl.interleave(
        tl.interleave(tl.interleave(v << 9, v >> 7), tl.interleave(v << 1, v >> 15)),
        tl.interleave(tl.interleave(v << 5, v >> 11), tl.interleave(v >> 3, v >> 19)),
    )
    h = (e & 0xE00) | ((e << 3) & 0x8000)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _word_e4m3(v):
    """int32 words [..., W] of e4m3fn codes -> float32 [..., W * 4] of value * 2^-8, in column order.

    As _word_e2m1: a code's 4 exponent and 3 mantissa bits go to float16's bits 13..7 (the low 4 of its
    5-bit exponent, the top 3 of its mantissa), its sign to bit 15. float16's bias (15) is e4m3's (7)
    plus 8, so the float16 is the value times 2^-8 exactly, e4m3's subnormals landing on float16's.
    (The NaN codes 0x7F / 0xFF come out as +-1.875 * 2^8: FP8 weights hold none.) Byte i of a word
    (bits 8i..8i+7) is shifted to bits 7..14 first.
    """
    e = tl.interleave(tl.interleave(v << 7, v >> 9), tl.interleave(v >> 1, v >> 17))
    h = (e & 0x3F80) | ((e << 1) & 0x8000)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _word_float(v, FLOAT_CODE: tl.constexpr):
    """Float codes -> value * 2^-14 (e2m1, FLOAT_CODE 4) or value * 2^-8 (e4m3, FLOAT_CODE 8)."""
    if FLOAT_CODE == 4:
        return _word_e2m1(v)
    else:
        return _word_e4m3(v)


@triton.jit
def _gemv_kernel(
    x_ptr,
    words_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_cn,
    stride_sn,
    stride_om,
    one,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    FLOAT_CODE: tl.constexpr,  # 0: affine codes with biases; 4: e2m1; 8: e4m3
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """words_ptr: the packed weight as int32 words ([N, K * BITS / 32], stride_cn in words)."""
    G: tl.constexpr = BLOCK_K // GROUP  # groups per step
    WG: tl.constexpr = GROUP * BITS // 32  # words per group
    LEVELS: tl.constexpr = 1 << BITS  # f = 1 + code / LEVELS
    UNDO: tl.constexpr = 16384.0 if FLOAT_CODE == 4 else 256.0  # float codes: the decode's power of two
    m0 = tl.program_id(1).to(tl.int64) * ROWS  # int64: M * N can pass 2^31 (long prompt x vocabulary)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    gi = tl.arange(0, G)
    jw = tl.arange(0, WG)
    jc = tl.arange(0, GROUP)
    rows = tl.arange(0, BLOCK_M)
    num_groups = K // GROUP
    word_ptrs = words_ptr + n.to(tl.int64)[:, None, None] * stride_cn + (gi[None, :, None] * WG + jw[None, None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N, G), dtype=tl.float32)
    # Software prefetch: the next step's words are in flight while this step computes.
    nxt = tl.load(word_ptrs, mask=n_ok[:, None, None] & (gi < num_groups)[None, :, None], other=0)
    for g0 in range(0, num_groups, G):
        words = nxt
        grp = g0 + gi
        g_ok = grp < num_groups
        ahead = (grp + G < num_groups)[None, :, None]
        nxt = tl.load(word_ptrs + (g0 + G) * WG, mask=n_ok[:, None, None] & ahead, other=0)
        sb_mask = n_ok[:, None] & g_ok[None, :]
        sb_off = n[:, None] * stride_sn + grp[None, :]
        if FLOAT_CODE:
            f = _word_float(words, FLOAT_CODE)  # [BLOCK_N, G, GROUP]: value * 2^-14 or 2^-8
            s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) * UNDO
            b = s  # (unused: no bias)
        else:
            f = _word_codes(words, one, BITS)  # [BLOCK_N, G, GROUP]
            s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) * LEVELS
            b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) - s
        x_off = (grp[:, None] * GROUP + jc[None, :]) * stride_xk
        for r in tl.static_range(ROWS):
            m = m0 + r
            xv = tl.load(x_ptr + m * stride_xm + x_off, mask=g_ok[:, None] & (m < M), other=0.0).to(tl.float32)
            # per group: s * sum(code * x) + b * sum(x) = (s * LEVELS) * sum(f * x) + (b - s * LEVELS) * sum(x)
            dots = tl.sum(f * xv[None, :, :], axis=2)  # [BLOCK_N, G]
            if FLOAT_CODE:
                part = dots * s
            else:
                part = dots * s + tl.sum(xv, axis=1)[None, :] * b
            acc += tl.where(rows[:, None, None] == r, part[None, :, :], 0.0)
    m = m0 + rows
    out = out_ptr + m[:, None] * stride_om + n[None, :]
    mask = (rows[:, None] < ROWS) & (m[:, None] < M) & n_ok[None, :]
    tl.store(out, tl.sum(acc, axis=2).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm_kernel(
    x_ptr,
    words_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_cn,
    stride_sn,
    stride_om,
    one,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    FLOAT_CODE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """words_ptr as in _gemv_kernel. A K step covers GS groups (BLOCK_K >= GROUP) or 1/GS of one (GS = 1)."""
    KS: tl.constexpr = BLOCK_K // GS  # columns per (row, slice); one scale and bias each
    WS: tl.constexpr = KS * BITS // 32  # words per (row, slice)
    LEVELS: tl.constexpr = 1 << BITS
    UNDO: tl.constexpr = 16384.0 if FLOAT_CODE == 4 else 256.0  # float codes: the decode's power of two
    m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: M * N can pass 2^31
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    gi = tl.arange(0, GS)
    jw = tl.arange(0, WS)
    jc = tl.arange(0, BLOCK_K)
    dt = x_ptr.dtype.element_ty
    word_ptrs = words_ptr + n.to(tl.int64)[:, None, None] * stride_cn + (gi[None, :, None] * WS + jw[None, None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        start = k0 + gi * KS  # first column of each slice; a slice lies inside one group
        s_ok = start < K
        words = tl.load(word_ptrs + k0 * BITS // 32, mask=n_ok[:, None, None] & s_ok[None, :, None], other=0)
        sb_mask = n_ok[:, None] & s_ok[None, :]
        sb_off = n[:, None] * stride_sn + (start // GROUP)[None, :]
        if FLOAT_CODE:
            s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) * UNDO
            w = tl.reshape((_word_float(words, FLOAT_CODE) * s[:, :, None]).to(dt), (BLOCK_N, BLOCK_K))
        else:
            f = _word_codes(words, one, BITS)  # [BLOCK_N, GS, KS]
            s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) * LEVELS
            b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32) - s
            # code * scale + bias = f * (scale * LEVELS) + (bias - scale * LEVELS): one FMA per weight
            w = tl.reshape((f * s[:, :, None] + b[:, :, None]).to(dt), (BLOCK_N, BLOCK_K))
        col = k0 + jc
        xv = tl.load(
            x_ptr + m[:, None] * stride_xm + col[None, :] * stride_xk,
            mask=m_ok[:, None] & (col < K)[None, :],
            other=0.0,
        )
        acc = tl.dot(xv, tl.trans(w), acc, input_precision=PRECISION)
    out = out_ptr + m[:, None] * stride_om + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@functools.cache
def _swept_configs() -> dict[tuple[int, int, int, int, bool], dict]:
    """Best GEMV configs per (N, K, bits, group, e2m1) from a JSON that scripts/bench_qgemv.py --json wrote,
    named by LANTERN_GEMV_CONFIGS (a sweep's winners tried end to end before they become the defaults)."""
    path = os.environ.get("LANTERN_GEMV_CONFIGS")
    if not path:
        return {}
    try:
        sweep = json.loads(Path(path).read_text())
        bits, group, e2m1 = int(sweep["bits"]), int(sweep["group"]), bool(sweep["e2m1"])
        table = {}
        for entry in sweep["shapes"]:
            if entry.get("best"):
                n, k = (int(v) for v in entry["shape"].split("x"))
                table[(n, k, bits, group, e2m1)] = dict(entry["best"]["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("LANTERN_GEMV_CONFIGS=%s not read (%s): the built-in GEMV configs apply", path, exc)
        return {}
    logger.info("GEMV configs for %d shapes from %s", len(table), path)
    return table


def _gemv_config(n: int, k: int, bits: int, group_size: int, e2m1: bool = False) -> dict:
    """4 KiB of codes per step for 4 warps: 16 bytes per thread twice (BLOCK_K = 2 vectors along K), 8 rows."""
    swept = _swept_configs().get((n, k, bits, group_size, e2m1))
    if swept is not None:
        return dict(swept)
    block_n = 8
    while block_n > 2 and triton.cdiv(n, block_n) < _MIN_PROGRAMS:
        block_n //= 2
    block_k = 4096 * 8 // bits // block_n
    block_k = max(group_size, min(block_k, triton.next_power_of_2(k)))  # no masked-off steps on small K
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 1}


def _gemm_config(m: int, n: int, k: int, bits: int, dtype: torch.dtype) -> dict:
    """Small M (decode batches): one 16-row tile, BLOCK_N as wide as ~1 program per SM allows; else 128 x 128."""
    if dtype == torch.float32:  # fp32 dots run on the FMA units (ieee): small tiles, no spills
        return {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    if m <= 64:
        block_m = max(16, triton.next_power_of_2(m))
        block_n = 64
        while block_n > 16 and triton.cdiv(n, block_n) < _GEMM_MIN_PROGRAMS:
            block_n //= 2
        block_k = 256 if block_m == 16 else 128
        return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}


FLOAT_CODES = {"affine": 0, "e2m1": 4, "e4m3": 8}  # code kind -> the kernels' FLOAT_CODE
_CODE_BITS = {"e2m1": 4, "e4m3": 8}


def _check(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor | None,
    bits: int,
    group: int,
    code: str,
) -> str:
    """`code` checked: "affine" (with biases), "e2m1" or "e4m3" (without)."""
    if code not in FLOAT_CODES:
        raise ValueError(f"unknown code kind {code!r} ({', '.join(FLOAT_CODES)})")
    if (biases is None) != (code != "affine"):
        raise ValueError(f"{code} weights take {'biases' if code == 'affine' else 'no biases'}")
    check_mode(bits, group, "affine" if code == "e4m3" else code)  # (e4m3: 8-bit bytes in affine's groups)
    if code != "affine" and bits != _CODE_BITS[code]:
        raise ValueError(f"{code} codes are {_CODE_BITS[code]}-bit, not {bits}-bit")
    k = x.shape[-1]
    n = packed.shape[0]
    if packed.dtype != torch.uint8 or packed.shape != (n, k * bits // 8):
        raise ValueError(f"packed {packed.dtype} {tuple(packed.shape)} does not hold {bits}-bit codes of {k} columns")
    if k % group or scales.shape != (n, k // group) or (biases is not None and biases.shape != scales.shape):
        shapes = f"scales {tuple(scales.shape)}" + ("" if biases is None else f" / biases {tuple(biases.shape)}")
        raise ValueError(f"{shapes} do not fit [{n}, {k}] / {group}")
    return code


def gemv(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor | None,
    bits: int,
    group_size: int,
    *,
    code: str = "affine",
    rows_per_pass: int = GEMV_MAX_M,
    **config,
) -> torch.Tensor:
    """The decode kernel for any M (passes of `rows_per_pass` rows); `config` overrides the block sizes.
    `code`: "affine" (biases given), "e2m1" or "e4m3" (biases None)."""
    code = _check(x, packed, scales, biases, bits, group_size, code)
    m, k = x.shape
    n = packed.shape[0]
    cfg = {**_gemv_config(n, k, bits, group_size, code == "e2m1"), **config}
    scales, packed = scales.contiguous(), packed.contiguous()
    biases = scales if biases is None else biases.contiguous()  # (float codes: never read)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    rows = min(m, rows_per_pass)
    words = packed.view(torch.int32)  # 4 bytes = 8 (4-bit) or 4 (8-bit) codes, little-endian: column order
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, rows))
    _gemv_kernel[grid](
        x, words, scales, biases, out, m, n, k,
        x.stride(0), x.stride(1), words.stride(0), scales.stride(0), out.stride(0), _ONE_BITS,
        BITS=bits, GROUP=group_size, FLOAT_CODE=FLOAT_CODES[code], ROWS=rows, BLOCK_M=triton.next_power_of_2(rows),
        **cfg,
    )  # fmt: skip
    return out


def gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor | None,
    bits: int,
    group_size: int,
    *,
    code: str = "affine",
    **config,
) -> torch.Tensor:
    """The tiled kernel for any M; `config` overrides the block sizes; `code` as in gemv."""
    code = _check(x, packed, scales, biases, bits, group_size, code)
    m, k = x.shape
    n = packed.shape[0]
    cfg = {**_gemm_config(m, n, k, bits, x.dtype), **config}
    scales, packed = scales.contiguous(), packed.contiguous()
    biases = scales if biases is None else biases.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    words = packed.view(torch.int32)
    block_k = cfg["BLOCK_K"]
    _gemm_kernel[grid](
        x, words, scales, biases, out, m, n, k,
        x.stride(0), x.stride(1), words.stride(0), scales.stride(0), out.stride(0), _ONE_BITS,
        BITS=bits, GROUP=group_size, FLOAT_CODE=FLOAT_CODES[code], GS=max(1, block_k // group_size),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **cfg,
    )  # fmt: skip
    return out


def affine_matmul(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """x [..., K] @ W.T -> [..., N] in x's dtype: a GEMV for M <= GEMV_MAX_M rows (dp4a on int8 activations
    where triton_gemv_dp4a.enabled says so, else the float one), else the GEMM."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] > GEMV_MAX_M:
        out = gemm(x2, packed, scales, biases, bits, group_size)
    elif triton_gemv_dp4a.enabled(x2, bits, group_size):
        _check(x2, packed, scales, biases, bits, group_size, "affine")
        out = triton_gemv_dp4a.gemv(x2, packed, scales, biases, bits, group_size)
    else:
        out = gemv(x2, packed, scales, biases, bits, group_size)
    return out.view(*x.shape[:-1], packed.shape[0])


def float_matmul(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, group_size: int, code: str
) -> torch.Tensor:
    """affine_matmul for float codes ("e2m1": 4-bit fp4, "e4m3": FP8 bytes): w = value * scale per group."""
    x2 = x.reshape(-1, x.shape[-1])
    fn = gemv if x2.shape[0] <= GEMV_MAX_M else gemm
    out = fn(x2, packed, scales, None, _CODE_BITS[code], group_size, code=code)
    return out.view(*x.shape[:-1], packed.shape[0])
