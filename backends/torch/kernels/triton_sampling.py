"""The Gumbel-max draw of sampler._argmax_with_noise in one Triton kernel (CUDA).

In torch ops the draw is ~20 launches a step -- the key's mixing, the column hash's two multiplies, shifts and
masks, the uniform, two logarithms, the temperature, the subtraction, the argmax -- each a few microseconds of
host time at batch 1, which on a GPU is about what the rest of a small model's sampling step costs. Here one
kernel hashes, takes the logarithms, scales, subtracts and finds each row's first maximum (NaN counting as the
maximum, as torch.argmax), a row's columns split over several programs whose last to finish (an atomic count,
triton_kernels.fold_counters) folds their parts in column order.

The values are sampler's, step for step: the same integer hash, u exact in float32, CUDA's own logf (tl.log
builds to libdevice's __nv_logf, the CUDA math library's logf that torch's log kernel calls; its flush-to-zero
build differs only on subnormals, and u, -log(u) and their logarithms never are), then one rounded multiply by T
and one rounded subtraction (fp fusion off: no FMA), so the token is the one the torch ops would draw.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lantern.backends.sampling_prep import MIX_C1, MIX_C2
from lantern.backends.torch.kernels.triton_kernels import fold_counters

BLOCK_COLS = 1024  # columns a program takes a step
_MAX_PARTS = 128  # programs a row at most (the fold reads them at once)
_TARGET_PROGRAMS = 256  # ~2 a streaming multiprocessor on an H100 / H200
_BIG = tl.constexpr(1 << 30)  # "no column yet"


@triton.jit
def _merge(best_v, best_i, best_nan, v, i, nan):
    """Fold a later part (v at column i; nan: v is NaN) into the best so far, torch.argmax's way: the first NaN,
    else the first strictly larger value (a part with no column, i = _BIG, never wins)."""
    take = (~best_nan) & (nan | (v > best_v) | ((best_i == _BIG) & (i < _BIG)))
    return tl.where(take, v, best_v), tl.where(take, i, best_i), best_nan | nan


@triton.jit
def _noisy_argmax_kernel(
    scores_ptr,
    hashes_ptr,
    keys_ptr,
    temps_ptr,
    part_v_ptr,
    part_i_ptr,
    count_ptr,
    tokens_ptr,
    C,
    cols_per_part,
    stride_s,
    stride_h,
    MIX1: tl.constexpr,
    MIX2: tl.constexpr,
    HAS_T: tl.constexpr,
    PARTS: tl.constexpr,
    PARTS_P: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    # the row's 32-bit key (stored as int64 or float64), then lowbias32's first step on it
    w = tl.load(keys_ptr + r).to(tl.int64) & 0xFFFFFFFF
    key16 = (w ^ (w >> 16)).to(tl.int32)
    if HAS_T:
        t = tl.load(temps_ptr + r).to(tl.float32)
    lo = p * cols_per_part
    hi = tl.minimum(lo + cols_per_part, C)
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), _BIG, tl.int32)
    best_nan = tl.full((), 0, tl.int1)
    for c0 in range(lo, hi, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        m = cols < hi
        a = tl.load(hashes_ptr + r * stride_h + cols, mask=m, other=0) ^ key16
        a = a * MIX1  # (int32 products wrap: the bits of uint32's)
        a = (a ^ ((a >> 15) & 0x1FFFF)) * MIX2  # (>> on int32 is arithmetic: the mask makes it logical)
        b = (a >> 9) & 0x7FFFFF
        b = b ^ (b >> 15)
        u = b.to(tl.float32) * (2.0**-23) + 2.0**-24  # ((bits >> 9) + 1/2) / 2^23: exact, in (0, 1)
        ng = tl.log(-tl.log(u))  # -gumbel (CUDA: libdevice's logf, as torch's log kernel; see the gpu test)
        if HAS_T:
            ng = ng * t
        v = tl.load(scores_ptr + r * stride_s + cols, mask=m, other=float("-inf")) - ng
        nan = (v != v) & m
        any_nan = tl.max(nan.to(tl.int32), 0) > 0
        first_nan = tl.min(tl.where(nan, cols, _BIG), 0)
        bv = tl.max(tl.where(m & ~nan, v, float("-inf")), 0)
        bi = tl.min(tl.where(m & (v == bv), cols, _BIG), 0)
        bv = tl.where(any_nan, float("nan"), bv)
        bi = tl.where(any_nan, first_nan, bi)
        best_v, best_i, best_nan = _merge(best_v, best_i, best_nan, bv, bi, any_nan)
    if PARTS == 1:
        tl.store(tokens_ptr + r, best_i.to(tl.int64))
    else:
        slot = r * PARTS + p
        tl.store(part_v_ptr + slot, best_v)
        tl.store(part_i_ptr + slot, tl.where(best_nan, -1 - best_i, best_i))  # (a NaN part: its index, negated)
        counter = count_ptr + r
        tl.debug_barrier()  # (as triton_kernels' fold: the stores of every thread before the count)
        if tl.atomic_add(counter, 1, sem="acq_rel") == PARTS - 1:  # the last part folds the row (see module)
            k = tl.arange(0, PARTS_P)
            km = k < PARTS
            pv = tl.load(part_v_ptr + r * PARTS + k, mask=km, other=float("-inf"), cache_modifier=".cg")
            pi = tl.load(part_i_ptr + r * PARTS + k, mask=km, other=_BIG, cache_modifier=".cg")
            nan = pi < 0
            first_nan = tl.min(tl.where(nan, -1 - pi, _BIG), 0)
            top = tl.max(tl.where(nan, float("-inf"), pv), 0)
            first_top = tl.min(tl.where(~nan & (pv == top) & km, pi, _BIG), 0)
            choice = tl.where(tl.max(nan.to(tl.int32), 0) > 0, first_nan, first_top)
            tl.store(tokens_ptr + r, choice.to(tl.int64))
            tl.store(counter, 0)


def noisy_argmax(
    scores: torch.Tensor, keys: torch.Tensor, col_hashes: torch.Tensor, temperature: torch.Tensor | None
) -> torch.Tensor | None:
    """argmax(scores - T log(-log(u))) per row, u from (key, column) as sampler._neg_gumbel_ makes it -> int64 [R];
    scores float32 [R, C], keys [R] or [R, 1] (32-bit values, int64 or float64), col_hashes int32 [C] or [R, C],
    temperature [R] or [R, 1] (float32 or float64: float32 values) or None (T = 1). None where the device's counters
    cannot serve the rows (the caller's torch ops then do it)."""
    rows, cols = scores.shape
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    hashes = col_hashes if col_hashes.stride(-1) == 1 else col_hashes.contiguous()
    parts = max(1, min(_MAX_PARTS, triton.cdiv(cols, BLOCK_COLS), triton.cdiv(_TARGET_PROGRAMS, max(rows, 1))))
    counters = fold_counters(scores.device, rows) if parts > 1 else scores
    if counters is None:
        return None
    out = torch.empty(rows, dtype=torch.int64, device=scores.device)
    if rows == 0:
        return out
    part_v = torch.empty(rows * parts, dtype=torch.float32, device=scores.device)
    part_i = torch.empty(rows * parts, dtype=torch.int32, device=scores.device)
    keys = keys.reshape(-1)
    if keys.dtype not in (torch.int64, torch.float64):
        keys = keys.to(torch.int64)
    temps = scores if temperature is None else temperature.reshape(-1)
    per_part = triton.cdiv(triton.cdiv(cols, parts), BLOCK_COLS) * BLOCK_COLS
    _noisy_argmax_kernel[(rows, parts)](
        scores, hashes, keys, temps, part_v, part_i, counters, out, cols, per_part, scores.stride(0),
        hashes.stride(0) if hashes.dim() == 2 else 0, MIX1=MIX_C1, MIX2=MIX_C2, HAS_T=temperature is not None,
        PARTS=parts, PARTS_P=triton.next_power_of_2(parts), BLOCK=BLOCK_COLS, enable_fp_fusion=False,
    )  # fmt: skip
    return out
