"""Compile every Triton kernel ahead of time for NVIDIA targets, with no GPU present.

Triton's wheel carries LLVM and ptxas, so a kernel goes source -> TTIR -> TTGIR -> LLVM IR -> PTX
-> cubin here exactly as on a GPU machine: type errors, tl.dot shape and dtype rules and register
allocation failures that the CPU interpreter never sees show up here. Run by test_compile_cuda.py
in a process without TRITON_INTERPRET (the interpreter replaces the kernels' JIT objects).
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lantern.backends.torch.kernels import triton_fused as tf
from lantern.backends.torch.kernels import triton_kernels as tk

TYPE_NAMES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
FLOAT32_PTRS = {"acc_ptr", "m_ptr", "l_ptr", "cos_ptr", "sin_ptr"}
INT_PTRS = {"bt_ptr": "*i32", "len_ptr": "*i32", "slot_ptr": "*i64"}


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
        elif name in ("scale", "eps"):
            sig[name] = "fp32"
        else:  # strides and lengths
            sig[name] = "i32"
    return sig


def attention_consts(d: int, group: int, block_size: int) -> dict:
    return {"BLOCK_SIZE": block_size, "HEAD_DIM": d, "BLOCK_D": triton.next_power_of_2(d), "GROUP": group}


CASES = [
    # (kernel, dtype, compute capability, constexprs)
    *[
        (
            tk._prefill_kernel,
            dt,
            cap,
            {
                **attention_consts(128, 4, 16),
                "BLOCK_M": 16,
                "BLOCK_N": 32,
                "PRECISION": "ieee" if dt == "fp32" else "tf32",
            },
        )
        for dt in ("bf16", "fp32")
        for cap in (80, 90)
    ],
    (tk._prefill_kernel, "fp16", 90, {**attention_consts(64, 1, 8), "BLOCK_M": 16, "BLOCK_N": 32, "PRECISION": "tf32"}),
    *[
        (
            tk._decode_partial_kernel,
            dt,
            cap,
            {**attention_consts(d, g, bs), "GROUP_P": triton.next_power_of_2(g), "NUM_SPLITS": 16, "NUM_HEADS": 32},
        )
        for dt, cap, d, g, bs in (("bf16", 90, 128, 8, 16), ("fp32", 80, 64, 1, 16), ("fp16", 90, 128, 4, 8))
    ],
    *[
        (
            tk._decode_reduce_kernel,
            dt,
            90,
            {"NUM_HEADS": 32, "NUM_SPLITS": s, "SPLITS_P": triton.next_power_of_2(s), "HEAD_DIM": 128, "BLOCK_D": 128},
        )
        for dt, s in (("bf16", 16), ("fp32", 3))
    ],
    *[(tk._write_kv_kernel, dt, 90, {"HEAD_DIM": 128, "BLOCK_D": 128}) for dt in ("bf16", "fp32")],
    *[
        (tf._rms_norm_kernel, dt, 90, {"HAS_RESIDUAL": res, "BLOCK": 4096})
        for dt in ("bf16", "fp32")
        for res in (False, True)
    ],
    *[(tf._rotary_kernel, dt, 90, {"HALF": 64, "BLOCK": 64}) for dt in ("bf16", "fp16")],
]


def main() -> int:
    failures = 0
    for fn, dtype, cap, consts in CASES:
        label = f"{fn.__name__} {dtype} sm_{cap}"
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature(fn, dtype, consts), constexprs=consts),
                target=GPUTarget("cuda", cap, 32),
            )
            assert compiled.asm["cubin"], "no cubin"
            print("ok", label, flush=True)
        except Exception as exc:
            failures += 1
            print("FAILED", label, type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
