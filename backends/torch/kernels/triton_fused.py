"""Triton kernels for the per-token elementwise work: RMSNorm fused with the residual add, rotary (alone, or with
the KV-cache write of the rotated keys and the values), SiLU(gate) * up, a quantized embedding's rows.

Each replaces several eager ops (and their launches and round trips through memory) with one
pass over the row; each matches a function of kernels/reference.py, rounding included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lantern.backends.torch.kernels import pdl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    n_cols,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.launch)
):
    if PDL:  # (kernels/pdl.py: wait for the kernel before, then let the next one launch)
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # The sum is rounded to the model dtype before the norm, as an eager `x + residual` is.
        h = h.to(tl.float32) + tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = h.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    normed = (hf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows, cols = x2.shape
    out = torch.empty_like(x2)
    if residual is None:
        res_in, res_out = x2, x2
    else:
        res_in = residual.reshape(-1, cols).contiguous()
        res_out = torch.empty_like(x2)
    _rms_norm_kernel[(rows,)](
        x2,
        res_in,
        weight,
        out,
        res_out,
        cols,
        eps,
        x2.stride(0),
        res_in.stride(0),
        out.stride(0),
        res_out.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(cols),
        **pdl.launch(x2),
    )
    return out.view(x.shape), (x if residual is None else res_out.view(x.shape))


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    stride_xt,
    stride_xh,
    stride_ct,
    stride_ot,
    stride_oh,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i, m, y1, y2 = _rotated_halves(x_ptr, cos_ptr, sin_ptr, t, h, stride_xt, stride_xh, stride_ct, HALF, BLOCK)
    dst = out_ptr + t * stride_ot + h * stride_oh
    ty = out_ptr.dtype.element_ty
    tl.store(dst + i, y1.to(ty), mask=m)
    tl.store(dst + HALF + i, y2.to(ty), mask=m)


@triton.jit
def _rotated_halves(
    x_ptr, cos_ptr, sin_ptr, t, h, stride_xt, stride_xh, stride_ct, HALF: tl.constexpr, BLOCK: tl.constexpr
):
    """Head h of token t turned by the rotate_half rope: (offsets, mask, x1 c - x2 s, x2 c + x1 s) in float32 -- the
    cos/sin rows are [freqs, freqs], so both halves use the first half's values."""
    i = tl.arange(0, BLOCK)
    m = i < HALF
    src = x_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t * stride_ct + i, mask=m, other=0.0)
    s = tl.load(sin_ptr + t * stride_ct + i, mask=m, other=0.0)
    return i, m, x1 * c - x2 * s, x2 * c + x1 * s


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    t, h, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    _rotary_kernel[(t, h)](
        x,
        cos,
        sin,
        out,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        out.stride(0),
        out.stride(1),
        HALF=d // 2,
        BLOCK=triton.next_power_of_2(d // 2),
    )
    return out


@triton.jit
def _rotary_write_kv_kernel(
    x_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    kp_ptr,
    vp_ptr,
    slot_ptr,
    stride_xt,
    stride_xh,
    stride_vt,
    stride_vh,
    stride_ct,
    stride_ot,
    stride_oh,
    stride_s,
    stride_sh,
    NUM_Q: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (pdl.launch)
):
    """_rotary_kernel over q's and k's heads [T, NUM_Q + KVH, D]; a k head's program also writes its rotated row
    and v's row into the pool at the token's slot (none where the slot is negative)."""
    if PDL:  # (kernels/pdl.py: wait for the kernel before, then let the next one launch)
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i, m, y1, y2 = _rotated_halves(x_ptr, cos_ptr, sin_ptr, t, h, stride_xt, stride_xh, stride_ct, HALF, BLOCK)
    ty = out_ptr.dtype.element_ty
    y1, y2 = y1.to(ty), y2.to(ty)
    dst = out_ptr + t * stride_ot + h * stride_oh
    tl.store(dst + i, y1, mask=m)
    tl.store(dst + HALF + i, y2, mask=m)
    if h >= NUM_Q:
        slot = tl.load(slot_ptr + t)
        if slot >= 0:
            kh = h - NUM_Q
            pool = slot * stride_s + kh * stride_sh
            pty = kp_ptr.dtype.element_ty
            tl.store(kp_ptr + pool + i, y1.to(pty), mask=m)
            tl.store(kp_ptr + pool + HALF + i, y2.to(pty), mask=m)
            vrow = v_ptr + t * stride_vt + kh * stride_vh
            vty = vp_ptr.dtype.element_ty
            tl.store(vp_ptr + pool + i, tl.load(vrow + i, mask=m).to(vty), mask=m)
            tl.store(vp_ptr + pool + HALF + i, tl.load(vrow + HALF + i, mask=m).to(vty), mask=m)


def rotary_write_kv(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """rotary(qk) [T, H + KVH, D] (q's heads, then k's), and the rotated k and v [T, KVH, D] written into the pools
    [slots, KVH, D] at `slots` (negative: skipped), as rotary then write_kv would: one kernel instead of two."""
    t, heads, d = qk.shape
    kvh = v.shape[1]
    if qk.stride(-1) != 1:
        qk = qk.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, heads, d), dtype=qk.dtype, device=qk.device)
    if t:
        _rotary_write_kv_kernel[(t, heads)](
            qk, v, cos, sin, out, k_pool, v_pool, slots,
            qk.stride(0), qk.stride(1), v.stride(0), v.stride(1), cos.stride(0), out.stride(0), out.stride(1),
            k_pool.stride(0), k_pool.stride(1), NUM_Q=heads - kvh, HALF=d // 2, BLOCK=triton.next_power_of_2(d // 2),
            **pdl.launch(qk),
        )  # fmt: skip
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inner, stride_g, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = i < inner
    gate = tl.load(gu_ptr + t * stride_g + i, mask=m, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + t * stride_g + inner + i, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    act = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)  # rounded as F.silu's output is, before the product
    tl.store(out_ptr + t * stride_o + i, (act * up).to(ty), mask=m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of gate_up [..., 2n] (gate first) -> [..., n] in one pass (eager torch takes two kernels
    and a round trip of the gate through memory), rounded as F.silu(gate) * up is."""
    width = gate_up.shape[-1]
    rows = gate_up.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    inner = width // 2
    out = torch.empty((rows.shape[0], inner), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(max(inner, 1)))
    if rows.shape[0] and inner:
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(inner, block))](
            rows, out, inner, rows.stride(0), out.stride(0), BLOCK=block
        )
    return out.view(*gate_up.shape[:-1], inner)


@triton.jit
def _affine_rows_kernel(
    ids_ptr,
    codes_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    K,
    stride_c,
    stride_s,
    stride_o,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < K
    row = tl.load(ids_ptr + t).to(tl.int64)
    if BITS == 4:  # byte j: column 2j in its low nibble, 2j + 1 in its high one (triton_quant.pack_codes)
        byte = tl.load(codes_ptr + row * stride_c + cols // 2, mask=m, other=0).to(tl.int32)
        code = (byte >> ((cols % 2) * 4)) & 15
    else:
        code = tl.load(codes_ptr + row * stride_c + cols, mask=m, other=0).to(tl.int32)
    s = tl.load(scale_ptr + row * stride_s + cols // GROUP, mask=m, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + row * stride_s + cols // GROUP, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_o + cols, (code.to(tl.float32) * s + b).to(out_ptr.dtype.element_ty), mask=m)


def affine_rows(
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    ids: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Rows `ids` of a packed affine weight (triton_quant's layout) dequantized -> [len(ids), K] in `dtype`: code *
    scale + bias in float32 (a multiply then an add, as the torch ops round them), then cast. One kernel where the
    ops take ~12 (gather, unpack, stack, two gathers of scales, casts, multiply, add)."""
    n_ids = ids.numel()
    k = packed.shape[1] * 8 // bits
    out = torch.empty((n_ids, k), dtype=dtype, device=packed.device)
    block = min(1024, triton.next_power_of_2(max(k, 1)))
    if n_ids and k:
        _affine_rows_kernel[(n_ids, triton.cdiv(k, block))](
            ids.reshape(-1), packed, scales, biases, out, k, packed.stride(0), scales.stride(0), out.stride(0),
            BITS=bits, GROUP=group_size, BLOCK=block, enable_fp_fusion=False,
        )  # fmt: skip
    return out
