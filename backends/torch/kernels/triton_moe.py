"""Fused mixture-of-experts on CUDA: tokens sorted by expert, block-aligned, one grouped GEMM per projection.

`fused_moe` computes what moe_reference.fused_moe_reference does:

1. `align_by_expert` sorts the T*k (token, expert) pairs by expert and pads each expert's run to a
   multiple of BLOCK_M, so every BLOCK_M-row block of the sorted list belongs to one expert
   (`block_expert`; -1 for blocks past the end, which exit at once). Torch ops with sizes known
   from T, k and E alone (no host sync): decode steps run inside CUDA graphs.
2. `_moe_gemm_kernel` (gate_up): each program takes one block of pairs and BLOCK_N output columns,
   gathers the pairs' token rows of x, and multiplies by its expert's matrix -> [T*k, 2I].
3. the layer's activation in torch ([T*k, I]): act(gate) * up, gpt-oss's clamped SwiGLU, or for ungated
   experts (Nemotron 3: gate_up holds the I up rows alone) act(up).
4. `_moe_gemm_kernel` (down) on those rows, each multiplied by its routing weight in float32 before
   the store -> [T*k, H]; the k rows of each token are summed in float32.

Each GEMM adds its expert's output bias (gpt-oss) in float32 before the routing weight. Weights are
float [E, N, K] or group-quantized `PackedExperts` (4-bit nibbles / 8-bit bytes with per-group scale
and bias, the layout of quant_reference.py; or float codes with a scale per group -- e2m1 nibbles,
MXFP4 / NVFP4, and e4m3 bytes, block-scaled FP8 -- decoded through a float16 as in
triton_quant._word_e2m1 / _word_e4m3): quantized tiles are dequantized in
registers and fed to tl.dot in the activations' dtype, so expert weights stay quantized in memory.
Block sizes are fixed per (dtype, pair count) rather than autotuned, for the same reason as in
triton_quant.py (CUDA graphs, no benchmarking pass at start-up). Not yet timed on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from lantern.backends.torch.kernels import triton_gemv_dp4a
from lantern.backends.torch.kernels.moe_reference import ACTIVATIONS, Experts, PackedExperts

GEMV_TOKENS = 2  # decode steps of up to this many tokens take the per-pair dp4a GEMV where it serves


@triton.jit
def _moe_gemm_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_bias_ptr,
    out_ptr,
    rw_ptr,
    sorted_ptr,
    expert_ptr,
    num_pairs,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_obe,
    stride_om,
    A_DIV: tl.constexpr,  # pair p reads row p // A_DIV of a: top_k for x, 1 for the [T*k, I] activations
    MUL_WEIGHT: tl.constexpr,  # scale each output row by its pair's routing weight (float32)
    OUT_BIAS: tl.constexpr,  # add the expert's output bias [E, N] (gpt-oss)
    QUANT: tl.constexpr,
    FLOAT_CODE: tl.constexpr,  # (QUANT) 4: e2m1 nibbles, 8: e4m3 bytes (w = value * scale, no bias); 0: affine
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    e = tl.load(expert_ptr + pid_m)
    if e < 0:  # a block past the padded end of the sorted pairs
        return
    e = e.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    m_ok = pair < num_pairs  # padding entries hold num_pairs
    a_row = (pair // A_DIV).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    dt = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        a = tl.load(a_ptr + a_row[:, None] * stride_am + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        if QUANT:
            if BITS == 4:  # two codes per byte, the even column in the low nibble
                byte = tl.load(
                    w_ptr + e * stride_we + n[:, None] * stride_wn + (kk // 2)[None, :], mask=w_mask, other=0
                )
                code = (byte.to(tl.int32) >> ((kk % 2) * 4)[None, :]) & 15
            else:
                code = tl.load(w_ptr + e * stride_we + n[:, None] * stride_wn + kk[None, :], mask=w_mask, other=0)
            sb = e * stride_se + n[:, None] * stride_sn + (kk // GROUP)[None, :]
            s = tl.load(scale_ptr + sb, mask=w_mask, other=0.0).to(tl.float32)
            if FLOAT_CODE == 4:  # exponent and mantissa bits under float16's exponent, the sign on top: value * 2^-14
                h = ((code & 7) << 9) | ((code & 8) << 12)
                w = (h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * (s * 16384.0)).to(dt)
            elif FLOAT_CODE == 8:  # the same for e4m3: value * 2^-8
                c = code.to(tl.int32)
                h = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
                w = (h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * (s * 256.0)).to(dt)
            else:
                b = tl.load(bias_ptr + sb, mask=w_mask, other=0.0).to(tl.float32)
                w = (code.to(tl.float32) * s + b).to(dt)
        else:
            w = tl.load(w_ptr + e * stride_we + n[:, None] * stride_wn + kk[None, :], mask=w_mask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
    if OUT_BIAS:
        acc += tl.load(out_bias_ptr + e * stride_obe + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if MUL_WEIGHT:
        rw = tl.load(rw_ptr + pair, mask=m_ok, other=0.0)
        acc = acc * rw[:, None]
    out = out_ptr + pair.to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids int32 [L], expert of each BLOCK_M block int32 [L / block_m]).

    Pairs p = t * k + j sorted by expert (stably), each expert's run padded with the id T*k to a
    multiple of block_m. L = P + min(E, P) * (block_m - 1) rounded to block_m bounds the padded
    length from the shapes alone; blocks past the real end get expert -1.
    """
    flat = topk_ids.reshape(-1).long()
    p = flat.numel()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    order = torch.sort(flat, stable=True).indices
    sorted_e = flat[order]
    rank = torch.arange(p, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest = (pad_end - padded)[sorted_e] + rank
    length = triton.cdiv(p + min(num_experts, p) * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((length,), p, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(0, length, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_start < pad_end[-1], block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


def _config(pairs: int, dtype: torch.dtype) -> dict:
    if dtype == torch.float32:  # fp32 dots run on the FMA units (ieee): small tiles
        return {"BLOCK_M": 16 if pairs <= 64 else 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    if pairs <= 64:  # decode: few pairs per expert, one 16-row tile each
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}


def moe_gemm(
    a: torch.Tensor,
    w: Experts,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_pairs: int,
    a_div: int,
    routing: torch.Tensor | None = None,
    out_bias: torch.Tensor | None = None,
    **config,
) -> torch.Tensor:
    """out[p] = (a[p // a_div] @ W[expert(p)].T + out_bias[expert(p)]) (* routing[p]) for each real pair p
    -> [num_pairs, N]."""
    cfg = {**_config(num_pairs, a.dtype), **config}
    block_m = cfg.pop("BLOCK_M")
    e, n, k = w.shape
    if a.shape[1] != k:
        raise ValueError(f"activations have {a.shape[1]} features, the experts take {k}")
    if out_bias is not None and tuple(out_bias.shape) != (e, n):
        raise ValueError(f"expert biases {tuple(out_bias.shape)} do not fit {e} experts of {n} outputs")
    if sorted_ids.numel() % block_m or block_expert.numel() != sorted_ids.numel() // block_m:
        raise ValueError(f"sorted ids of length {sorted_ids.numel()} are not aligned to BLOCK_M={block_m}")
    a = a.contiguous()
    out = torch.empty((num_pairs, n), dtype=a.dtype, device=a.device)
    if num_pairs == 0:
        return out
    quant = isinstance(w, PackedExperts)
    float_code = {"affine": 0, "e2m1": 4, "e4m3": 8}[w.code] if quant else 0
    if quant and ((w.biases is None) != (float_code != 0) or (float_code and w.bits != float_code)):
        raise ValueError(f"packed experts of code {w.code!r} ({w.bits}-bit) need biases exactly when affine")
    if quant:
        data, scales = w.packed.contiguous(), w.scales.contiguous()
        biases = scales if w.biases is None else w.biases.contiguous()  # (float codes: never read)
        bits, group = w.bits, w.group_size
    else:
        data = w.contiguous()
        scales = biases = data  # unused: the kernel's QUANT branch is compiled out
        bits, group = 16, 1
    ob = out if out_bias is None else out_bias.contiguous()
    rw = routing.float().contiguous() if routing is not None else out
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), block_expert.numel())
    _moe_gemm_kernel[grid](
        a, data, scales, biases, ob, out, rw, sorted_ids, block_expert, num_pairs, n, k,
        a.stride(0), data.stride(0), data.stride(1), scales.stride(0), scales.stride(1), ob.stride(0), out.stride(0),
        A_DIV=a_div, MUL_WEIGHT=routing is not None, OUT_BIAS=out_bias is not None, QUANT=quant, FLOAT_CODE=float_code,
        BITS=bits, GROUP=group, BLOCK_M=block_m, PRECISION="ieee" if a.dtype == torch.float32 else "tf32", **cfg,
    )  # fmt: skip
    return out


def fused_moe(
    x: torch.Tensor,
    gate_up: Experts,
    down: Experts,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    activate: Callable[[torch.Tensor], torch.Tensor] | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    gemv: bool | None = None,
    **config,
) -> torch.Tensor:
    """x [T, H] through each token's k experts, weighted and summed -> [T, H] in x's dtype. `activate` maps the
    first GEMM's rows to the second's input (the layer's own: SparseMoE.activate; default silu(gate) * up, gate
    rows first); the biases ([E, 2I], [E, H]) are added to each expert's outputs.
    Decode steps (T <= GEMV_TOKENS) of packed affine experts and 16-bit x take the per-pair dp4a GEMV
    (int8 activations, triton_gemv_dp4a.expert_gemv; `gemv` True / False forces the choice), the rest the
    grouped GEMM; `config` overrides its block sizes (the interpreter tests use tiny ones)."""
    t, k = topk_ids.shape
    pairs = t * k
    if gemv is None:
        gemv = t <= GEMV_TOKENS and decode_gemv_serves(x, gate_up, down)
    if gemv:
        return _fused_moe_gemv(x, gate_up, down, topk_ids, topk_weights, activate, gate_up_bias, down_bias)
    block_m = config.get("BLOCK_M") or _config(pairs, x.dtype)["BLOCK_M"]
    sorted_ids, block_expert = align_by_expert(topk_ids, gate_up.shape[0], block_m)
    cfg = {**config, "BLOCK_M": block_m}
    h = moe_gemm(x, gate_up, sorted_ids, block_expert, pairs, k, out_bias=gate_up_bias, **cfg)
    if activate is None:
        gate, up = h.chunk(2, dim=-1)
        a = ACTIVATIONS["silu"](gate) * up
    else:
        a = activate(h)
    routing = topk_weights.reshape(-1)
    y = moe_gemm(a, down, sorted_ids, block_expert, pairs, 1, routing=routing, out_bias=down_bias, **cfg)
    return y.view(t, k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)


def decode_gemv_serves(x: torch.Tensor, gate_up: Experts, down: Experts) -> bool:
    """Whether both projections can take the dp4a GEMV: packed affine experts, 16-bit x, and the kernel
    enabled (LANTERN_GEMV, and on a GPU its self-check)."""
    return all(
        isinstance(w, PackedExperts) and triton_gemv_dp4a.enabled(x, w.bits, w.group_size, w.code)
        for w in (gate_up, down)
    )


def _fused_moe_gemv(
    x: torch.Tensor,
    gate_up: PackedExperts,
    down: PackedExperts,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    activate: Callable[[torch.Tensor], torch.Tensor] | None,
    gate_up_bias: torch.Tensor | None,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """fused_moe for a decode step: each (token, expert) pair's rows by the dp4a GEMV, nothing sorted."""
    t, k = topk_ids.shape
    ids = topk_ids.reshape(-1).to(torch.int32)  # once for both GEMVs
    gemv = triton_gemv_dp4a.expert_gemv
    assert gate_up.biases is not None and down.biases is not None  # (affine: decode_gemv_serves)
    # The default activation is made in the first GEMV's epilogue (silu(gate) * up of each pair's row pairs).
    a = gemv(x, gate_up.packed, gate_up.scales, gate_up.biases, gate_up.bits, gate_up.group_size, ids, k,
             out_bias=gate_up_bias, gated=activate is None)  # fmt: skip
    if activate is not None:
        a = activate(a)
    y = gemv(a, down.packed, down.scales, down.biases, down.bits, down.group_size, ids, 1,
             routing=topk_weights.reshape(-1), out_bias=down_bias)  # fmt: skip
    return y.view(t, k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
