"""The fused-MoE kernel compiles to cubins for Ampere (sm_80) and Hopper (sm_90), without a GPU.

The approach of compile_for_cuda.py (Triton's wheel carries ptxas: source -> TTIR -> TTGIR -> LLVM
-> PTX -> cubin on a CPU-only machine), for triton_moe's kernel at the block sizes fused_moe picks
(decode and prefill tiles), float, 4/8-bit affine, e2m1 (fp4) and e4m3 (FP8) experts, with and without the
routing weight and the experts' output biases (gpt-oss). This file is also the script the test
runs, in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def cases() -> list[tuple[str, str, int, dict, dict]]:
    """(label, dtype, compute capability, constexprs, compile options) for each compilation."""
    import torch

    from lantern.backends.torch.kernels import triton_moe as tm

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    out = []
    combos = [
        # dtype, cap, pairs (decode / prefill tiles), bits (None: float experts), group, routing weight
        # [, float code (4: e2m1, 8: e4m3), output bias]
        ("bf16", 90, 8, None, 1, False),
        ("bf16", 90, 8, None, 1, True),
        ("bf16", 80, 4096, None, 1, True),
        ("bf16", 90, 4096, None, 1, False),
        ("fp16", 80, 8, None, 1, True),
        ("fp32", 90, 32, None, 1, True),
        ("fp32", 80, 4096, None, 1, False),
        ("bf16", 90, 8, 4, 64, False),
        ("bf16", 90, 4096, 4, 64, True),
        ("bf16", 80, 8, 8, 64, True),
        ("fp16", 90, 4096, 8, 32, False),
        ("fp32", 80, 16, 4, 128, True),
        ("bf16", 90, 8, 4, 32, True, 4, True),  # gpt-oss MXFP4 decode
        ("bf16", 80, 4096, 4, 32, False, 4, True),
        ("bf16", 90, 4096, 4, 16, True, 4, False),  # NVFP4
        ("bf16", 90, 8, None, 1, True, 0, True),  # gpt-oss in bf16
        ("bf16", 90, 8, 8, 128, True, 8, False),  # block-scaled FP8 experts (Qwen3-MoE FP8, DeepSeek)
        ("bf16", 80, 4096, 8, 128, False, 8, False),
    ]
    for dt, cap, pairs, bits, group, weighted, *rest in combos:
        code, out_bias = rest or (0, False)
        cfg = tm._config(pairs, torch_dtype[dt])
        options = {k: v for k, v in cfg.items() if k.startswith("num_")}
        consts = {k: v for k, v in cfg.items() if k not in options}
        consts.update(
            A_DIV=8 if not weighted else 1,
            MUL_WEIGHT=weighted,
            OUT_BIAS=out_bias,
            QUANT=bits is not None,
            FLOAT_CODE=code,
            BITS=bits or 16,
            GROUP=group,
            PRECISION="ieee" if dt == "fp32" else "tf32",
        )
        kind = ({4: "e2m1", 8: "e4m3"}.get(code, f"{bits}-bit")) + f" g{group}" if bits else "float"
        label = f"_moe_gemm_kernel {dt} sm_{cap} {kind} BLOCK_M={consts['BLOCK_M']} weighted={weighted}"
        label += " biased" if out_bias else ""
        out.append((label, dt, cap, consts, options))
    return out


def signature(fn, dtype: str, consts: dict) -> dict[str, str]:
    quant = consts["QUANT"]
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ("sorted_ptr", "expert_ptr"):
            sig[name] = "*i32"
        elif name == "w_ptr":
            sig[name] = "*u8" if quant else TYPES[dtype]
        elif name == "rw_ptr":
            sig[name] = "*fp32" if consts["MUL_WEIGHT"] else TYPES[dtype]
        elif name.endswith("_ptr"):
            sig[name] = TYPES[dtype]
        else:  # counts and strides
            sig[name] = "i32"
    return sig


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lantern.backends.torch.kernels import triton_moe as tm

    fn = tm._moe_gemm_kernel
    failures = 0
    for label, dtype, cap, consts, options in cases():
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature(fn, dtype, consts), constexprs=consts),
                target=GPUTarget("cuda", cap, 32),
                options=options,
            )
            assert compiled.asm["cubin"], "no cubin"
            print("ok", label, flush=True)
        except Exception as exc:
            failures += 1
            print("FAILED", label, type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
    return 1 if failures else 0


def test_moe_kernel_compiles_for_nvidia_targets(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))  # a fresh cache: really compile
    result = subprocess.run(
        [sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    compiled = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) == 18
    assert any("bf16 sm_90 4-bit g64 BLOCK_M=64" in line for line in compiled)  # quantized prefill tile
    assert any("bf16 sm_90 e2m1 g32 BLOCK_M=16 weighted=True biased" in line for line in compiled)
    assert any("bf16 sm_80 float BLOCK_M=64" in line for line in compiled)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
