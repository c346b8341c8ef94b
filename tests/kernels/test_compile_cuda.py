"""Every Triton kernel compiles to a cubin for Ampere (sm_80) and Hopper (sm_90), without a GPU.

The CPU interpreter (the other kernel tests) checks what the kernels compute; this checks that
the compiler accepts them as a GPU would build them. See compile_for_cuda.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_nvidia_targets(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))  # a fresh cache: really compile
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_for_cuda.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    compiled = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) == 84 and any("_prefill_kernel bf16 sm_90" in line for line in compiled)
    # soft-capping and sinks, with the sliding window every attention kernel takes at run time
    assert "ok _prefill_kernel bf16 sm_90 softcap sinks" in compiled
    assert "ok _decode_partial_kernel bf16 sm_80 softcap" in compiled
    assert "ok _decode_reduce_kernel bf16 sm_90 sinks" in compiled
    assert (
        "ok _decode_partial_kernel bf16 sm_80 fold" in compiled
        and "ok _decode_partial_kernel fp16 sm_90 sinks fold" in compiled
    )
    # the quantized matmuls, at the block sizes affine_matmul picks for decode and prefill
    assert any(line.startswith("ok _gemv_kernel bf16 sm_90 4-bit g128") for line in compiled)
    assert any(line.startswith("ok _gemm_kernel bf16 sm_80 4-bit g64 BLOCK_M=128") for line in compiled)
    dp4a = [line for line in compiled if line.startswith("ok _gemv_dp4a_kernel")]
    assert len(dp4a) == 18 and any("sm_80 8-bit g64 TWO_ROWS=True" in line for line in dp4a)  # (one with PDL)
    assert sum("EXPERTS=True" in line for line in dp4a) == 4
    assert sum("GATED=True" in line for line in dp4a) == 5  # SiLU(gate) * up in the epilogue (one with PDL)
    assert "ok _silu_mul_kernel bf16 sm_90" in compiled and "ok _rotary_write_kv_kernel bf16 sm_90" in compiled
    assert sum(line.startswith("ok _noisy_argmax_kernel fp32") for line in compiled) == 3  # the sampling draw
    assert "ok _affine_rows_kernel bf16 sm_90 4-bit g64" in " ".join(compiled)  # a quantized embedding's lookup
    assert any(line.startswith("ok _gemv_kernel bf16 sm_90 e2m1 g16") for line in compiled)  # NVFP4 decode
    assert any(line.startswith("ok _gemm_kernel bf16 sm_80 e2m1 g32 BLOCK_M=128") for line in compiled)
    assert any(line.startswith("ok _gemv_kernel bf16 sm_90 e4m3 g128") for line in compiled)  # block FP8 decode
    # a decode step's kernels with programmatic dependent launch (griddepcontrol in their PTX: compile_for_cuda)
    assert sum(line.endswith(" pdl") for line in compiled) == 4 and "ok _rms_norm_kernel bf16 sm_90 pdl" in compiled


def test_the_gemv_loop_takes_one_fma_a_weight_on_hopper(tmp_path):
    """scripts/gemv_sass.py on the 8B gate/up matrix: the sm_90 loop (as the JIT builds it at run time) holds one
    FFMA per weight a thread streams -- the GEMV's design (a group's affine applied once, outside the dot) -- and
    no local-memory spills; the instructions a weight are what the H200's ~2 TB/s was issue-bound by."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    code = (
        "import json, sys; sys.argv = ['gemv_sass']; sys.path.insert(0, 'scripts'); import gemv_sass; "
        "print(json.dumps(gemv_sass.main([])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    ops = report["opcodes"]
    assert ops["FFMA"] == report["weights_per_thread_step"]
    assert "LDL" not in ops and "STL" not in ops
    assert 3 <= report["per_weight"] < 12


@pytest.mark.parametrize("shape,bits,bound", [("28672x4096", 4, 2.2), ("4096x14336", 4, 2.2), ("4096x4096", 8, 3.2)])
def test_the_dp4a_gemv_loop_takes_two_dp4a_per_four_weights(tmp_path, shape, bits, bound):
    """The dp4a GEMV's sm_90 loop: two IDP.4A per 4 weights a thread streams (x's two int8 levels; the inline
    PTX became the instruction), plus 16 a block for the sums of x's codes; no spills; and under `bound`
    instructions a weight in all (the float GEMV's 6.6 left the H200 issue-bound at ~40% of HBM)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    argv = ["--kernel", "dp4a", "--shape", shape, "--bits", str(bits)]
    code = (
        "import json, sys; sys.path.insert(0, 'scripts'); import gemv_sass; "
        f"print(json.dumps(gemv_sass.main({argv!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    ops = report["opcodes"]
    assert ops["IDP"] == 2 * report["weights_per_thread_step"] / 4 + 16  # (one 32-column block a thread)
    assert "LDL" not in ops and "STL" not in ops
    assert report["per_weight"] < bound
