"""Compile every Triton kernel ahead of time for NVIDIA targets, with no GPU present.

Triton's wheel carries LLVM and ptxas, so a kernel goes source -> TTIR -> TTGIR -> LLVM IR -> PTX
-> cubin here exactly as on a GPU machine: type errors, tl.dot shape and dtype rules and register
allocation failures that the CPU interpreter never sees show up here. Run by test_compile_cuda.py
in a process without TRITON_INTERPRET (the interpreter replaces the kernels' JIT objects).
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lantern.backends.torch.kernels import triton_fused as tf
from lantern.backends.torch.kernels import triton_gemv_dp4a as td
from lantern.backends.torch.kernels import triton_kernels as tk
from lantern.backends.torch.kernels import triton_quant as tq
from lantern.backends.torch.kernels import triton_sampling as ts

TYPE_NAMES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
FLOAT32_PTRS = {"acc_ptr", "m_ptr", "l_ptr", "cos_ptr", "sin_ptr", "sinks_ptr"}
INT_PTRS = {"bt_ptr": "*i32", "len_ptr": "*i32", "slot_ptr": "*i64", "codes_ptr": "*u8", "words_ptr": "*i32"}
INT_PTRS["xpairs_ptr"] = "*i32"  # the dp4a GEMV reads 16-bit activations two to a word
INT_PTRS["expert_ptr"] = "*i32"  # (and with experts, each pair's expert)
INT_PTRS["count_ptr"] = "*i32"  # (the decode kernel's fold counters)
INT_PTRS.update(hashes_ptr="*i32", part_i_ptr="*i32", tokens_ptr="*i64")  # the sampling draw's
INT_PTRS["ids_ptr"] = "*i64"  # (a quantized embedding's lookup)
INT_PTRS.update(keys_ptr="*fp64", temps_ptr="*fp64")  # (keys and temperatures: one float64 upload, as sampler makes it)
FLOAT32_PTRS.update({"scores_ptr", "part_v_ptr"})
FLOAT32_PTRS.add("rw_ptr")


def signature(fn, dtype: str, consts: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in INT_PTRS:
            sig[name] = INT_PTRS[name]
        elif name in FLOAT32_PTRS:
            sig[name] = "*fp32"
        elif name.endswith("_ptr"):
            sig[name] = TYPE_NAMES[dtype]
        elif name in ("scale", "eps", "softcap"):
            sig[name] = "fp32"
        else:  # strides, lengths and the sliding window
            sig[name] = "i32"
    return sig


def attention_consts(d: int, group: int, block_size: int) -> dict:
    return {"BLOCK_SIZE": block_size, "HEAD_DIM": d, "BLOCK_D": triton.next_power_of_2(d), "GROUP": group}


def split_config(cfg: dict) -> tuple[dict, dict]:
    """A launch config -> (constexprs, compile options such as num_warps)."""
    options = {k: v for k, v in cfg.items() if k.startswith("num_")}
    return {k: v for k, v in cfg.items() if k not in options}, options


def gemv_case(
    dtype: str, cap: int, bits: int, group: int, rows: int, n: int = 4096, k: int = 4096, code: int = 0
) -> tuple:
    consts, options = split_config(tq._gemv_config(n, k, bits, group))
    consts.update(BITS=bits, GROUP=group, FLOAT_CODE=code, ROWS=rows, BLOCK_M=triton.next_power_of_2(rows))
    return (tq._gemv_kernel, dtype, cap, consts, options)


def gemm_case(
    dtype: str, cap: int, bits: int, group: int, m: int, n: int = 4096, k: int = 4096, code: int = 0
) -> tuple:
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    consts, options = split_config(tq._gemm_config(m, n, k, bits, torch_dtype))
    consts.update(BITS=bits, GROUP=group, FLOAT_CODE=code, GS=max(1, consts["BLOCK_K"] // group))
    consts.update(PRECISION="ieee" if dtype == "fp32" else "tf32")
    return (tq._gemm_kernel, dtype, cap, consts, options)


def dp4a_case(
    dtype: str,
    cap: int,
    bits: int,
    group: int,
    rows: int,
    n: int = 4096,
    k: int = 4096,
    experts: bool = False,
    gated: bool = False,
) -> tuple:
    consts, options = split_config(td._config(n, k, bits))
    consts.update(BITS=bits, GROUP=group, X_BF16=dtype == "bf16", ASM=True, TWO_ROWS=rows > 1 and not experts)
    consts.update(EXPERTS=experts, A_DIV=8 if experts else 1, MUL_WEIGHT=experts and not gated, OUT_BIAS=experts)
    consts.update(GATED=gated)
    consts.update(EVEN_N=n % consts["BLOCK_N"] == 0, EVEN_K=k % (32 * consts["NB"]) == 0)
    return (td._gemv_dp4a_kernel, dtype, cap, consts, options)


def prefill_case(dtype: str, cap: int, d: int, group: int, bs: int, softcap: bool = False, sinks: bool = False):
    consts = {**attention_consts(d, group, bs), "BLOCK_M": 16, "BLOCK_N": 32}
    consts.update(PRECISION="ieee" if dtype == "fp32" else "tf32", HAS_SOFTCAP=softcap, HAS_SINKS=sinks)
    return (tk._prefill_kernel, dtype, cap, consts)


def decode_case(
    dtype: str, cap: int, d: int, group: int, bs: int, softcap: bool = False, fold: bool = False, sinks: bool = False
):
    consts = {**attention_consts(d, group, bs), "GROUP_P": triton.next_power_of_2(group), "NUM_SPLITS": 16}
    consts.update(NUM_HEADS=32, HAS_SOFTCAP=softcap, FOLD=fold, HAS_SINKS=sinks)
    return (tk._decode_partial_kernel, dtype, cap, consts)


def reduce_case(dtype: str, splits: int, sinks: bool = False):
    consts = {"NUM_HEADS": 32, "NUM_SPLITS": splits, "SPLITS_P": triton.next_power_of_2(splits)}
    return (tk._decode_reduce_kernel, dtype, 90, {**consts, "HEAD_DIM": 128, "BLOCK_D": 128, "HAS_SINKS": sinks})


def sampling_case(cap: int, parts: int, temps: bool) -> tuple:
    consts = {"MIX1": ts.MIX_C1, "MIX2": ts.MIX_C2, "HAS_T": temps, "PARTS": parts, "BLOCK": ts.BLOCK_COLS}
    consts["PARTS_P"] = triton.next_power_of_2(parts)
    return (ts._noisy_argmax_kernel, "fp32", cap, consts, {"enable_fp_fusion": False})


CASES = [
    # (kernel, dtype, compute capability, constexprs[, compile options])
    *[prefill_case(dt, cap, 128, 4, 16) for dt in ("bf16", "fp32") for cap in (80, 90)],
    prefill_case("fp16", 90, 64, 1, 8),
    # soft-capping (Gemma 2) and sinks (gpt-oss); sliding windows are a runtime argument of every case
    prefill_case("bf16", 90, 256, 2, 16, softcap=True, sinks=True),  # Gemma's head dim
    prefill_case("bf16", 80, 64, 8, 16, softcap=True, sinks=True),  # gpt-oss's
    *[decode_case(dt, cap, d, g, bs) for dt, cap, d, g, bs in (("bf16", 90, 128, 8, 16), ("fp32", 80, 64, 1, 16))],
    decode_case("fp16", 90, 128, 4, 8),
    *[decode_case("bf16", cap, 256, 2, 16, softcap=True) for cap in (80, 90)],
    # ... folding its splits itself (the last program of a sequence and KV head: no reduce kernel)
    *[decode_case("bf16", cap, 128, 4, 16, fold=True) for cap in (80, 90)],
    decode_case("fp16", 90, 64, 8, 16, fold=True, sinks=True),
    reduce_case("bf16", 16),
    reduce_case("fp32", 3),
    reduce_case("bf16", 16, sinks=True),
    *[(tk._write_kv_kernel, dt, 90, {"HEAD_DIM": 128, "BLOCK_D": 128}) for dt in ("bf16", "fp32")],
    *[
        (tf._rms_norm_kernel, dt, 90, {"HAS_RESIDUAL": res, "BLOCK": 4096})
        for dt in ("bf16", "fp32")
        for res in (False, True)
    ],
    *[(tf._rotary_kernel, dt, 90, {"HALF": 64, "BLOCK": 64}) for dt in ("bf16", "fp16")],
    *[(tf._silu_mul_kernel, dt, cap, {"BLOCK": 1024}) for dt, cap in (("bf16", 90), ("fp16", 80))],
    *[(tf._rotary_write_kv_kernel, dt, 90, {"NUM_Q": 32, "HALF": 64, "BLOCK": 64}) for dt in ("bf16", "fp16")],
    *[
        (tf._affine_rows_kernel, dt, cap, {"BITS": bits, "GROUP": group, "BLOCK": 1024}, {"enable_fp_fusion": False})
        for dt, cap, bits, group in (("bf16", 90, 4, 64), ("fp16", 80, 8, 32))
    ],
    # the sampling draw (one part a row, and many folded), as sampler runs it: no FMA
    *[sampling_case(cap, parts, temps) for cap, parts, temps in ((90, 126, False), (80, 1, True), (90, 8, True))],
    # Quantized matmuls with the block sizes affine_matmul picks: decode (8B-model rows, a narrow
    # k/v projection) and prefill (M = 512) tiles, 4- and 8-bit, every group size, both targets.
    *[gemv_case("bf16", cap, bits, group, 1) for cap in (80, 90) for bits, group in ((4, 128), (8, 64))],
    gemv_case("fp16", 90, 4, 32, 2, n=1024),
    gemv_case("fp32", 90, 8, 32, 2),
    *[gemm_case("bf16", cap, bits, group, 512) for cap in (80, 90) for bits, group in ((4, 64), (8, 128))],
    gemm_case("bf16", 90, 4, 128, 16),
    gemm_case("fp16", 90, 8, 32, 40, n=1024),
    gemm_case("fp32", 80, 4, 32, 512),
    # The dp4a GEMV (int8 activations, inline PTX): 8B gate/up (16-row programs) and down (NB 64), o (8
    # rows), two rows, fp16, 8-bit, and a ragged matrix (masked N and K)
    *[dp4a_case("bf16", cap, 4, 64, 1, n=28672) for cap in (80, 90)],
    dp4a_case("bf16", 90, 4, 128, 1, k=14336),
    dp4a_case("bf16", 90, 4, 32, 2),
    dp4a_case("fp16", 80, 4, 64, 1),
    *[dp4a_case("bf16", cap, 8, 64, rows) for cap in (80, 90) for rows in (1, 2)],
    dp4a_case("bf16", 90, 4, 32, 2, n=4100, k=1536),
    # ... and per (token, expert) pair for MoE decode: a Qwen3-30B-A3B-like gate_up (K 2048) and down (K 768)
    *[dp4a_case("bf16", cap, 4, 64, 1, n=1536, k=2048, experts=True) for cap in (80, 90)],
    dp4a_case("fp16", 90, 8, 32, 1, n=2048, k=768, experts=True),
    # ... with SiLU(gate) * up in the epilogue: the 8B gate_up (one and two rows), a MoE gate_up
    *[dp4a_case("bf16", cap, 4, 64, 1, n=28672, gated=True) for cap in (80, 90)],
    dp4a_case("fp16", 90, 8, 32, 2, n=28672, gated=True),
    dp4a_case("bf16", 90, 4, 64, 1, n=1536, k=2048, experts=True, gated=True),
    # e2m1 (fp4) codes: MXFP4's groups of 32 and NVFP4's of 16, decode and prefill
    *[gemv_case("bf16", cap, 4, group, 1, code=4) for cap in (80, 90) for group in (16, 32)],
    gemv_case("fp16", 90, 4, 32, 2, n=1024, code=4),
    *[gemm_case("bf16", cap, 4, group, 512, code=4) for cap in (80, 90) for group in (16, 32)],
    gemm_case("fp16", 90, 4, 16, 16, code=4),
    # e4m3 (FP8 bytes with block-wise scales, or on GPUs without FP8 matmuls): 128-column groups
    *[gemv_case("bf16", cap, 8, 128, 1, code=8) for cap in (80, 90)],
    *[gemm_case("bf16", cap, 8, 128, 512, code=8) for cap in (80, 90)],
    gemm_case("fp16", 80, 8, 128, 16, code=8),
    # Hopper's programmatic dependent launch (kernels/pdl.py) in the kernels of a decode step
    *[
        (fn, "bf16", 90, {**consts, "PDL": True}, {**options, "launch_pdl": True})
        for fn, _, _, consts, *rest in (
            dp4a_case("bf16", 90, 4, 64, 1, n=28672, gated=True),
            decode_case("bf16", 90, 128, 4, 16, fold=True),
            (tf._rms_norm_kernel, "bf16", 90, {"HAS_RESIDUAL": True, "BLOCK": 4096}),
            (tf._rotary_write_kv_kernel, "bf16", 90, {"NUM_Q": 32, "HALF": 64, "BLOCK": 64}),
        )
        for options in (rest[0] if rest else {},)
    ],
]


def main() -> int:
    failures = 0
    for fn, dtype, cap, consts, *options in CASES:
        if "PDL" in fn.arg_names:
            consts = {"PDL": False, **consts}
        label = f"{fn.__name__} {dtype} sm_{cap}"
        if "BITS" in consts:
            kind = {4: "e2m1", 8: "e4m3"}.get(consts.get("FLOAT_CODE", 0), f"{consts['BITS']}-bit")
            label += f" {kind} g{consts['GROUP']} " + " ".join(
                f"{k}={consts[k]}"
                for k in ("ROWS", "TWO_ROWS", "EXPERTS", "GATED", "BLOCK_M", "BLOCK_N", "BLOCK_K", "NB", "EVEN_K")
                if k in consts
            )
        label += "".join(f" {flag[4:].lower()}" for flag in ("HAS_SOFTCAP", "HAS_SINKS") if consts.get(flag))
        label += " fold" if consts.get("FOLD") else ""
        label += " pdl" if consts.get("PDL") else ""
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature(fn, dtype, consts), constexprs=consts),
                target=GPUTarget("cuda", cap, 32),
                options=options[0] if options else None,
            )
            assert compiled.asm["cubin"], "no cubin"
            # (a PDL kernel waits for the one before first; none other carries the instruction)
            assert ("griddepcontrol.wait" in compiled.asm["ptx"]) == bool(consts.get("PDL")), "griddepcontrol"
            print("ok", label, flush=True)
        except Exception as exc:
            failures += 1
            print("FAILED", label, type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
