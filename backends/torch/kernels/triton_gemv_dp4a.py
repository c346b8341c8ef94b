"""Decode GEMV on group-quantized weights with int8 activations: dp4a, as llama.cpp's CUDA MMVQ does.

The float GEMV (triton_quant._gemv_kernel) turns every 4-bit code into a float and spends one FMA on it;
on an H200 its loop issues ~6.6 instructions a weight (scripts/gemv_sass.py) and stalls at 30-46% of HBM,
where ~3 a weight would leave it bandwidth-bound. This kernel keeps the codes as bytes and multiplies four
at a time: x is quantized inside the kernel per 32 columns in two int8 levels, as the CPU's VNNI kernel
does -- d = absmax / 127, q1 = round(x / d), q2 = round((x / d - q1) * 254), x ~ d (q1 + q2 / 254), within
~1.5e-5 of the block's absmax (one level, llama.cpp's q8_1, leaves ~1% per product on real activations and
changed SmolLM2's greedy answers on the CPU) -- and one `dp4a` adds four code x int8 products into an int32.

- 4-bit word (8 nibbles, column order): `w & 0x0F0F0F0F` holds the even columns' codes as bytes and
  `w & 0xF0F0F0F0` the odd columns' times 16, so x is packed the same way (even / odd columns) and a word
  costs two LOP3 and four dp4a (two sets, two levels), chained through dp4a's accumulator per (row,
  block): 16 (254 dot(code, q1) + dot(code, q2)), the 1/16 going into the float scale.
- 8-bit word (4 bytes): two dp4a (a level each) against x's bytes in column order.
- Per (row, 32-column block): dx (s dot(code, q) + b sum(q)), q = 254 q1 + q2 (|dot| < 2^28: int32).

Each thread owns one 32-column block of x at a step (quantizes it in registers; four int8 codes go into a
word by byte permutes) and the same block of BLOCK_N rows (4-bit: its 16 bytes of each row are one vector
load, the step's words of a row being loaded as one flat run so that Triton lays them out so); 4 warps
cover 4096 columns a step. On sm_90 the loop issues 1.9 instructions a weight at 16 rows a program (every
8B matrix), 2.6 at 8, 3.8 at 4, 2.9 for 8-bit (scripts/gemv_sass.py --kernel dp4a), against the float
GEMV's 6.6 / 8.3. Only bf16 / fp16 activations, affine codes and groups that are multiples of 32 take this
kernel (`supports`); the rest stay on the float GEMV. `dp4a` and `prmt` are inline PTX; under
TRITON_INTERPRET the same sums are made from shifts and multiplies (ASM=False), so the CPU tests check the
packing, rounding and scaling, and the PTX is checked on a GPU (tests marked gpu, and `verify` at load).
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lantern.backends.torch.kernels import pdl

logger = logging.getLogger(__name__)

XBLOCK_COLS = 32  # columns per int8 scale of x
XBLOCK = tl.constexpr(XBLOCK_COLS)
# 1.5 * 2^23: the float bits of MAGIC + r are MAGIC_BITS + round(r) (to nearest even), for |r| < 2^22
_MAGIC = tl.constexpr(12582912.0)
_MAGIC_BITS = tl.constexpr(0x4B400000)
LEVEL2_STEPS = 254  # x = d (q1 + q2 / 254): the second int8 level's steps per step of the first
LEVEL2 = tl.constexpr(LEVEL2_STEPS)
_MIN_PROGRAMS = 240  # ~2 programs per SM on a 132-SM H100 / H200 (a 4096-row matrix: 256 of 16 rows)


@triton.jit
def _dp4a(a, b, c, ASM: tl.constexpr):
    """c + sum over the 4 bytes of a (unsigned) times those of b (signed)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        s = c
        for i in tl.static_range(4):
            s += ((a >> (8 * i)) & 0xFF) * ((b << (24 - 8 * i)) >> 24)  # (int32 >> is arithmetic)
        return s


@triton.jit
def _bytes4(a, b, c, d, ASM: tl.constexpr):
    """The low bytes of four int32 tensors as one word's bytes 0..3: two byte permutes and a third to join."""
    if ASM:
        ab = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x0040;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
        )
        cd = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x0040;", "=r,r,r", [c, d], dtype=tl.int32, is_pure=True, pack=1
        )
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [ab, cd], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        return (a & 0xFF) | ((b & 0xFF) << 8) | ((c & 0xFF) << 16) | (d << 24)


@triton.jit
def _quantize_x(
    xpairs_ptr,
    m,
    stride_xm,
    cb,
    b_ok,
    BITS: tl.constexpr,
    X_BF16: tl.constexpr,
    ASM: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """x's 32-column blocks `cb` in two int8 levels, x = dx (LEVEL2 q1 + q2) -> (q1's words [NB, WPB] for the
    even / low bytes, for the odd / high bytes (4-bit; 8-bit: the same set twice), q2's two, dx [NB],
    sum(q) [NB])."""
    WPB: tl.constexpr = XBLOCK * BITS // 32  # weight words per block
    P: tl.constexpr = 32 // BITS // 2  # pairs of x per weight word
    jw = tl.arange(0, WPB)
    ip = tl.arange(0, P)
    # x read as int32 pairs of 16-bit floats: pair (j, i) holds columns 32 cb + 32 / WPB j + 2 i (+1).
    offs = cb[:, None, None] * (XBLOCK // 2) + jw[None, :, None] * P + ip[None, None, :]
    if EVEN_K:
        pairs = tl.load(xpairs_ptr + m * stride_xm + offs)
    else:
        pairs = tl.load(xpairs_ptr + m * stride_xm + offs, mask=b_ok[:, None, None], other=0)
    if X_BF16:
        even = (pairs << 16).to(tl.float32, bitcast=True)
        odd = (pairs & -65536).to(tl.float32, bitcast=True)
    else:
        even = (pairs & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        odd = (pairs >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    amax = tl.maximum(tl.max(tl.max(tl.abs(even), 2), 1), tl.max(tl.max(tl.abs(odd), 2), 1))
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    e1, e2 = _two_levels(even, inv[:, None, None])
    o1, o2 = _two_levels(odd, inv[:, None, None])
    lo1, hi1 = _pack(e1, o1, BITS, ASM)
    lo2, hi2 = _pack(e2, o2, BITS, ASM)
    # sum(q) of q = LEVEL2 q1 + q2, as dp4a sums of the packed bytes (ones x q)
    ones = tl.full(lo1.shape, 0x01010101, tl.int32)
    if BITS == 4:
        s1 = tl.sum(_dp4a(ones, hi1, _dp4a(ones, lo1, 0, ASM), ASM), 1)
        s2 = tl.sum(_dp4a(ones, hi2, _dp4a(ones, lo2, 0, ASM), ASM), 1)
    else:
        s1 = tl.sum(_dp4a(ones, lo1, 0, ASM), 1)
        s2 = tl.sum(_dp4a(ones, lo2, 0, ASM), 1)
    sumq = s1 * LEVEL2 + s2
    return lo1, hi1, lo2, hi2, amax / (127.0 * LEVEL2), sumq


@triton.jit
def _two_levels(x, inv):
    """x and 127 / absmax -> the float bits of MAGIC + q1 and of MAGIC + q2 for r = x * inv (|r| <= 127):
    q1 = round(r), q2 = round((r - q1) * LEVEL2), both int8 (|r - q1| <= 1/2), r ~ q1 + q2 / LEVEL2 within
    1 / (2 LEVEL2). (Where the compiler fuses x * inv into both lines, as for sm_90, q1 rounds the exact r and
    frac is r - q1 rounded once: |frac| <= 1/2 all the same.)"""
    b1 = x * inv + _MAGIC
    frac = x * inv - (b1 - _MAGIC)
    return b1.to(tl.int32, bitcast=True), (frac * LEVEL2 + _MAGIC).to(tl.int32, bitcast=True)


@triton.jit
def _pack(re, ro, BITS: tl.constexpr, ASM: tl.constexpr):
    """The int8 codes in the low bytes of re / ro (even / odd columns, [NB, WPB, P]) -> words [NB, WPB] laid
    out as the weight's: 4-bit, byte i of a word is column 2i (lo: even set) or 2i + 1 (hi: odd set) of its
    8; 8-bit, bytes in column order (pair i: bytes 2i, 2i + 1), one set returned twice."""
    NBX: tl.constexpr = re.shape[0]
    WPB: tl.constexpr = re.shape[1]
    if BITS == 4:
        e02, e13 = tl.split(tl.reshape(re, (NBX, WPB, 2, 2)))
        o02, o13 = tl.split(tl.reshape(ro, (NBX, WPB, 2, 2)))
        e0, e2 = tl.split(e02)
        e1, e3 = tl.split(e13)
        o0, o2 = tl.split(o02)
        o1, o3 = tl.split(o13)
        return _bytes4(e0, e1, e2, e3, ASM), _bytes4(o0, o1, o2, o3, ASM)
    else:
        e0, e1 = tl.split(re)
        o0, o1 = tl.split(ro)
        lo = _bytes4(e0, o0, e1, o1, ASM)
        return lo, lo


@triton.jit
def _dot_words(w, xw, c, ASM: tl.constexpr):
    """c + sum over j of dp4a(w[..., j], xw[:, j]) for w [BLOCK_N, NB, WPB], xw [NB, WPB]: one dp4a chain per
    (row, block), its words split off the last axis (in-thread) rather than summed after."""
    WPB: tl.constexpr = w.shape[2]
    if WPB == 1:
        return _dp4a(tl.reshape(w, (w.shape[0], w.shape[1])), tl.reshape(xw, (xw.shape[0],))[None, :], c, ASM)
    else:
        wa, wb = tl.split(tl.reshape(w, (w.shape[0], w.shape[1], WPB // 2, 2)))
        xa, xb = tl.split(tl.reshape(xw, (xw.shape[0], WPB // 2, 2)))
        return _dot_words(wb, xb, _dot_words(wa, xa, c, ASM), ASM)


@triton.jit
def _row_part(
    xpairs_ptr,
    m,
    stride_xm,
    cb,
    b_ok,
    w,
    s,
    b,
    BITS: tl.constexpr,
    X_BF16: tl.constexpr,
    ASM: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """One row of x against the words w [BLOCK_N, NB, WPB]: per (row, block) dx (s dot(code, q) + b sum(q)),
    x = dx q in the block (two int8 levels: q = LEVEL2 q1 + q2)."""
    lo1, hi1, lo2, hi2, dx, sumq = _quantize_x(xpairs_ptr, m, stride_xm, cb, b_ok, BITS, X_BF16, ASM, EVEN_K)
    if BITS == 4:
        even, odd = w & 0x0F0F0F0F, w & -252645136  # 0xF0F0F0F0: the odd codes times 16
        zero = tl.zeros_like(sumq)[None, :]
        t = _dot_words(odd, hi1, _dot_words(even, lo1, zero, ASM) * 16, ASM)  # 16 sum(code q1)
        # 16 sum(code q): one chain of dp4a per (row, block) and level
        idot = _dot_words(odd, hi2, t * LEVEL2 + _dot_words(even, lo2, zero, ASM) * 16, ASM)
        dscale = dx * (1.0 / 16.0)
    else:  # (a chain measured no better here: a block's 8 words span two threads)
        idot = tl.sum(_dp4a(w, lo1[None, :, :], 0, ASM), 2) * LEVEL2 + tl.sum(_dp4a(w, lo2[None, :, :], 0, ASM), 2)
        dscale = dx
    return idot.to(tl.float32) * s * dscale[None, :] + b * (sumq.to(tl.float32) * dx)[None, :]


@triton.jit
def _gemv_dp4a_kernel(
    xpairs_ptr,
    words_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    expert_ptr,  # EXPERTS: int32 [pairs], each pair's expert
    rw_ptr,  # EXPERTS and MUL_WEIGHT: float32 [pairs], each pair's routing weight
    out_bias_ptr,  # EXPERTS and OUT_BIAS: [E, N], each expert's output bias
    M,
    N,
    K,
    stride_xm,
    stride_we,
    stride_cn,
    stride_se,
    stride_sn,
    stride_obe,
    stride_om,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    X_BF16: tl.constexpr,
    ASM: tl.constexpr,
    TWO_ROWS: tl.constexpr,  # a program takes rows 2p and 2p + 1 of x: one read of the weights for both
    EXPERTS: tl.constexpr,  # program p takes pair p: row p // A_DIV of x against its expert's matrix
    A_DIV: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    OUT_BIAS: tl.constexpr,
    GATED: tl.constexpr,  # N rows = gate's then up's: out [.., N / 2] = silu(gate) * up (`_gated_rows`)
    BLOCK_N: tl.constexpr,
    NB: tl.constexpr,  # 32-column blocks a step: one per thread
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0
    EVEN_K: tl.constexpr,  # K % (32 NB) == 0
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.launch)
):
    """xpairs_ptr: x as int32 pairs (stride_xm in pairs); words_ptr: the packed weight as int32 words
    ([N, K * BITS / 32]; with EXPERTS [E, N, K * BITS / 32], stride_we words an expert, stride_se its scales')."""
    if PDL:  # (kernels/pdl.py: wait for the kernel before, then let the next one launch)
        gdc_wait()
        gdc_launch_dependents()
    WPB: tl.constexpr = XBLOCK * BITS // 32
    p = tl.program_id(1).to(tl.int64)
    if EXPERTS:
        e = tl.load(expert_ptr + p).to(tl.int64)
        words_ptr += e * stride_we
        scale_ptr += e * stride_se
        bias_ptr += e * stride_se
        m = p // A_DIV
    else:
        e = p  # (unused)
        m = p * (2 if TWO_ROWS else 1)
    if GATED:
        n, n_ok = _gated_rows(N // 2, BLOCK_N)
    else:
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
    jk = tl.arange(0, NB * WPB)  # a step's words of a row: flat, so that a thread's vector is one block's
    num_blocks = K // XBLOCK
    word_rows = words_ptr + n.to(tl.int64)[:, None] * stride_cn + jk[None, :]
    acc = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    for b0 in range(0, num_blocks, NB):
        cb = b0 + tl.arange(0, NB)
        b_ok = cb < num_blocks
        sb_off = n[:, None] * stride_sn + (cb * XBLOCK // GROUP)[None, :]
        if EVEN_K and EVEN_N:  # no masks: no predicates and no zero-filled registers in the loop
            w = tl.reshape(tl.load(word_rows + b0 * WPB), (BLOCK_N, NB, WPB))
            s = tl.load(scale_ptr + sb_off).to(tl.float32)
            b = tl.load(bias_ptr + sb_off).to(tl.float32)
        else:
            k_ok = b0 * WPB + jk < num_blocks * WPB
            w_ok = n_ok[:, None] & k_ok[None, :]
            w = tl.reshape(tl.load(word_rows + b0 * WPB, mask=w_ok, other=0), (BLOCK_N, NB, WPB))
            sb_mask = n_ok[:, None] & b_ok[None, :]
            s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
            b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
        acc += _row_part(xpairs_ptr, m, stride_xm, cb, b_ok, w, s, b, BITS, X_BF16, ASM, EVEN_K)
        if TWO_ROWS:  # (the second row of an odd M reads row M - 1 again and is not stored)
            m2 = tl.minimum(m + 1, M - 1)
            acc2 += _row_part(xpairs_ptr, m2, stride_xm, cb, b_ok, w, s, b, BITS, X_BF16, ASM, EVEN_K)
    y = tl.sum(acc, 1)
    if EXPERTS:  # as moe_gemm: the expert's bias, then the routing weight, in float32
        if OUT_BIAS:
            y += tl.load(out_bias_ptr + e * stride_obe + n, mask=n_ok, other=0.0).to(tl.float32)
        _store(y, out_ptr + p * stride_om, N, True, GATED, rw_ptr + p, MUL_WEIGHT)
    else:
        _store(y, out_ptr + m * stride_om, N, True, GATED, rw_ptr, False)
    if TWO_ROWS:
        _store(tl.sum(acc2, 1), out_ptr + (m + 1) * stride_om, N, m + 1 < M, GATED, rw_ptr, False)


@triton.jit
def _gated_rows(INNER, BLOCK_N: tl.constexpr):
    """A GATED program's rows: BLOCK_N / 2 output columns c, each as the gate's row c and the up's row INNER + c
    side by side (so the epilogue pairs them in-thread), and which are in range."""
    i = tl.arange(0, BLOCK_N)
    c = tl.program_id(0) * (BLOCK_N // 2) + i // 2
    return c + (i % 2) * INNER, c < INNER


@triton.jit
def _store(y, row_ptr, N, row_ok, GATED: tl.constexpr, rw_ptr, MUL_WEIGHT: tl.constexpr):
    """A program's rows' values y [BLOCK_N] -> its outputs in row_ptr's row (where row_ok): y, or with GATED
    silu(gate) * up of its row pairs (float32, one rounding), at its output columns; times *rw_ptr with
    MUL_WEIGHT."""
    BLOCK_N: tl.constexpr = y.shape[0]
    if GATED:
        gate, up = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))
        y = gate * tl.sigmoid(gate) * up
        cols = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        width = N // 2
    else:
        cols, width = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), N
    if MUL_WEIGHT:
        y *= tl.load(rw_ptr)
    tl.store(row_ptr + cols, y.to(row_ptr.dtype.element_ty), mask=(cols < width) & row_ok)


def supports(x: torch.Tensor, bits: int, group_size: int, code: str) -> bool:
    """Whether gemv() takes these activations and weights: bf16 / fp16 x, affine 4/8-bit codes, groups of 32k."""
    return x.dtype in (torch.bfloat16, torch.float16) and code == "affine" and bits in (4, 8) and group_size % 32 == 0


@functools.cache
def mode() -> str:
    """LANTERN_GEMV: "dp4a" (the default) or "float" (the float GEMV for every decode step: x unrounded)."""
    value = os.environ.get("LANTERN_GEMV", "dp4a").strip().lower() or "dp4a"
    if value not in ("dp4a", "float"):
        logger.warning("LANTERN_GEMV=%s is neither dp4a nor float: dp4a", value)
        value = "dp4a"
    return value


_verified: dict[int, bool] = {}
# Bounds of the self-check's error relative to the output's largest value: bf16 outputs' own rounding reaches
# ~8e-3; fp16 outputs come out within ~1e-4 of the reference (one int8 level alone would be ~5e-3 off).
_SELF_CHECK_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-3}


def self_check(device: torch.device) -> float:
    """The kernel on small 4- and 8-bit problems -- masked and unmasked, 1 and 2 rows, bf16 and fp16, 16-row
    programs as the 8B matrices take them, biases off the centre, the gated epilogue (ragged and whole) -- against
    int8_activation_matmul_reference (with silu(gate) * up for the gated cases):
    the largest error relative to the output's largest value, as a fraction of its dtype's bound (< 1: right)."""
    from lantern.backends.torch.kernels import quant_reference as qr
    from lantern.backends.torch.kernels.triton_quant import pack_codes

    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    cases = [(4, 256, 4096, 64, {"BLOCK_N": 16}), (4, 40, 160, 32, {}), (8, 24, 4096, 128, {}), (8, 37, 160, 32, {})]
    cases += [(4, 74, 160, 32, {"gated": True}), (8, 2 * 24, 1024, 64, {"gated": True})]  # (its epilogue too)
    for bits, n, k, group, cfg in cases:
        codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
        packed = pack_codes(codes, bits).to(device)
        scales = torch.rand(n, k // group, generator=gen) * 0.02 + 0.005
        biases = -scales * (1 << (bits - 1)) + 0.02 * torch.randn(n, k // group, generator=gen)
        x32 = torch.randn(2, k, generator=gen)
        for dtype in (torch.bfloat16, torch.float16):
            s, b = scales.to(device, dtype), biases.to(device, dtype)
            for m in (1, 2):
                x = x32[:m].to(device, dtype)
                if cfg.get("gated"):  # from the float32 sums, rounded once as the kernel's epilogue does
                    xq = qr.int8_activations(x)
                    gate, up = qr.affine_matmul_reference(xq, packed, s, b, bits, group).chunk(2, dim=-1)
                    want = (torch.nn.functional.silu(gate) * up).to(dtype).float()
                else:
                    want = qr.int8_activation_matmul_reference(x, packed, s, b, bits, group).float()
                got = gemv(x, packed, s, b, bits, group, **cfg).float()
                err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
                worst = max(worst, err / _SELF_CHECK_TOL[dtype])
    return worst


def verify(device: torch.device) -> bool:
    """Once per CUDA device (at model load, outside graph capture): `self_check`, the inline PTX included.
    A mismatch or a failure to build is logged and turns the kernel off for the process: the float GEMV
    serves, slower but right. (Off a GPU the kernel runs in the interpreter, which the tests check: True.)"""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _verified:
        try:
            try:
                worst = self_check(device)
            except Exception as exc:  # (a driver refusing PDL launches: the kernel without it, once more)
                if not pdl.enabled(torch.empty(0, device=device)) or not pdl.turn_off(f"the dp4a GEMV failed: {exc}"):
                    raise
                worst = self_check(device)
        except Exception as exc:  # a compiler or launch failure on this GPU: the float GEMV instead
            logger.error("the dp4a GEMV does not run on cuda:%d (%s: %s): the float GEMV serves", index,
                         type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")  # fmt: skip
            _verified[index] = False
            return False
        _verified[index] = worst < 1.0
        if _verified[index]:
            logger.info(
                "decode GEMV on cuda:%d: dp4a on int8 activations (self-check at %.2f of its bound)", index, worst
            )
        else:
            logger.error("the dp4a GEMV is %.3g times its bound off its reference on cuda:%d: the float GEMV serves",
                         worst, index)  # fmt: skip
    return _verified[index]


def enabled(x: torch.Tensor, bits: int, group_size: int, code: str = "affine") -> bool:
    """Whether a decode step of this x and weight takes gemv(): LANTERN_GEMV, `supports`, and on a GPU a
    passed `verify` (never run while a CUDA graph is being captured: the float GEMV until it has run)."""
    if mode() != "dp4a" or not supports(x, bits, group_size, code):
        return False
    if x.device.type != "cuda":
        return True
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if index not in _verified and torch.cuda.is_current_stream_capturing():
        return False
    return verify(x.device)


def _config(n: int, k: int, bits: int, rows_of_x: int = 1) -> dict:
    """One 32-column block of x per thread: NB blocks a step (<= 128, 4 warps), dividing K's blocks where a
    power of two >= 32 does (no masked steps). Rows a program: as many of 16 (4-bit; 8-bit: 8), 8, 4 as still
    leave ~2 programs per SM -- each quantized block of x serves them all (sm_90: 1.9 instructions a weight
    at 16 rows, 2.6 at 8, 3.8 at 4; ~130 registers a thread at 16)."""
    blocks = max(1, k // XBLOCK_COLS)
    nb = 128
    while nb > 32 and blocks % nb:
        nb //= 2
    if blocks % nb:
        nb = min(128, triton.next_power_of_2(blocks))
    block_n = 16 if bits == 4 else 8
    while block_n > 4 and triton.cdiv(n, block_n) * rows_of_x < _MIN_PROGRAMS:  # (rows_of_x: MoE pairs)
        block_n //= 2
    return {"BLOCK_N": block_n, "NB": nb, "num_warps": max(1, min(4, nb // 32))}


def gemv(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    gated: bool = False,
    **config,
) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) @ W.T for packed affine codes (triton_quant's layout): one program per
    (BLOCK_N rows, row of x). Callers check `supports` and the shapes (triton_quant._check).
    gated: W's rows are a gate's then an up projection's (a gated MLP's gate_up): the output is
    silu(gate) * up [M, N / 2], made in float32 from the two sums (one kernel instead of three)."""
    m, k = x.shape
    n = packed.shape[0]
    if k % XBLOCK_COLS or (gated and n % 2):
        raise ValueError(f"the dp4a GEMV takes K a multiple of {XBLOCK_COLS} (gated: N even), not {n}x{k}")
    cfg = {**_config(n, k, bits), **config}
    out = torch.empty((m, n // 2 if gated else n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    pairs = _pairs(x)  # [M, K / 2]: two activations a word
    words = packed.contiguous().view(torch.int32)
    scales, biases = scales.contiguous(), biases.contiguous()
    two_rows = m > 1
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, 2) if two_rows else m)
    _gemv_dp4a_kernel[grid](
        pairs, words, scales, biases, out, out, out, out, m, n, k,
        pairs.stride(0), 0, words.stride(0), 0, scales.stride(0), 0, out.stride(0),
        BITS=bits, GROUP=group_size, X_BF16=x.dtype == torch.bfloat16, TWO_ROWS=two_rows, EXPERTS=False, A_DIV=1,
        MUL_WEIGHT=False, OUT_BIAS=False, GATED=gated, ASM=not _interpreting(),
        EVEN_N=n % cfg["BLOCK_N"] == 0, EVEN_K=k % (XBLOCK_COLS * cfg["NB"]) == 0, **cfg, **pdl.launch(x),
    )  # fmt: skip
    return out


def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET), where inline PTX cannot run."""
    return bool(triton.knobs.runtime.interpret)


def _pairs(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] (16-bit) as int32 pairs [M, K / 2], copied first where its rows are not so aligned."""
    if x.stride(1) != 1 or x.stride(0) % 2 or x.storage_offset() % 2:
        # (not .contiguous(): a one-row slice or an odd offset counts as contiguous and would not be copied)
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    return x.view(torch.int32)


def expert_gemv(
    a: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    experts: torch.Tensor,
    a_div: int,
    routing: torch.Tensor | None = None,
    out_bias: torch.Tensor | None = None,
    gated: bool = False,
    **config,
) -> torch.Tensor:
    """triton_moe.moe_gemm's contract for decode: out[p] = (a[p // a_div] @ W[experts[p]].T + out_bias[experts[p]])
    (* routing[p]) for each pair p -> [pairs, N] in a's dtype, W packed affine experts [E, N, K * bits / 8]
    (scales / biases [E, N, K / group]); one program per (BLOCK_N rows, pair), no sorting by expert. gated: as
    gemv's (after out_bias): silu(gate) * up [pairs, N / 2]."""
    _, n, _ = packed.shape
    k = a.shape[1]
    if k % XBLOCK_COLS or packed.shape[2] != k * bits // 8 or (gated and n % 2):
        raise ValueError(
            f"experts {tuple(packed.shape)} do not take {k} features at {bits} bits (K % 32 == 0; gated: N even)"
        )
    pairs_count = experts.numel()
    if not supports(a, bits, group_size, "affine") or pairs_count != a.shape[0] * a_div:
        raise ValueError(
            f"expert_gemv takes bf16 / fp16 rows, affine 4/8-bit experts in groups of 32k and one expert per pair "
            f"({pairs_count} experts for {a.shape[0]} rows x {a_div}), not {a.dtype} / {bits}-bit g{group_size}"
        )
    cfg = {**_config(n, k, bits, pairs_count), **config}
    out = torch.empty((pairs_count, n // 2 if gated else n), dtype=a.dtype, device=a.device)
    if pairs_count == 0 or n == 0:
        return out
    xp = _pairs(a)
    words = packed.contiguous().view(torch.int32)  # [E, N, K * bits / 32]
    scales, biases = scales.contiguous(), biases.contiguous()
    ids = experts.reshape(-1).to(torch.int32)  # (no copy where the caller made them int32 already)
    rw = out if routing is None else routing.reshape(-1).float().contiguous()
    ob = out if out_bias is None else out_bias.contiguous()
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), pairs_count)
    _gemv_dp4a_kernel[grid](
        xp, words, scales, biases, out, ids, rw, ob, a.shape[0], n, k,
        xp.stride(0), words.stride(0), words.stride(1), scales.stride(0), scales.stride(1), ob.stride(0), out.stride(0),
        BITS=bits, GROUP=group_size, X_BF16=a.dtype == torch.bfloat16, TWO_ROWS=False, EXPERTS=True, A_DIV=a_div,
        MUL_WEIGHT=routing is not None, OUT_BIAS=out_bias is not None, GATED=gated,
        ASM=not _interpreting(), EVEN_N=n % cfg["BLOCK_N"] == 0,
        EVEN_K=k % (XBLOCK_COLS * cfg["NB"]) == 0, **cfg, **pdl.launch(a),
    )  # fmt: skip
    return out
