"""cpu_gemm.py: the native int4 and int8 GEMMs against aten's kernels and the decode-then-matmul
reference, the layers' use of them, their place in a compiled graph, and the fallback when switched off.

Two references nobody here wrote: aten's `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm` on the
same bytes, which the kernels must match bit for bit (they round x and the output to bf16 as aten does,
so a row's result cannot depend on how many rows share its step), and the weight rebuilt in float64
from the random codes (and for int4 the bf16 scales/zeros as `(q - 8) * scale + zero`, aten's
documented layout): within BF16 = 2**-6 normwise, the bound test_torch_quant_linear.py derives for
the bf16 CPU kernels; a wrong nibble, row, group or tail column costs >= 10%.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lantern.app.models.quant.affine import AffineWeight, ErrorLog
from lantern.backends.torch import cpu_gemm, native_build, packed_decode
from lantern.backends.torch import quant_linear as ql

BF16 = 2.0**-6

needs_kernel = pytest.mark.skipif(
    not native_build.cpu_has_avx512(), reason="the native kernel is built for x86-64 CPUs with AVX-512 only"
)


def packed_weight(n: int, k: int, g: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, scales_and_zeros, float64 reference weight [n, k]) for random codes and scales."""
    gen = torch.Generator().manual_seed(seed)
    n_pad = -(-n // 64) * 64
    q = torch.randint(0, 16, (n_pad, k), dtype=torch.int32, generator=gen)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    scale = torch.rand(k // g, n_pad, generator=gen) * 0.02 + 0.005
    zero = torch.randn(k // g, n_pad, generator=gen) * 0.01
    sz = torch.stack((scale, zero), dim=-1).to(torch.bfloat16)
    s = sz[..., 0].double().t().repeat_interleave(g, dim=1)  # [n_pad, k]
    z = sz[..., 1].double().t().repeat_interleave(g, dim=1)
    w = (q.double() - 8) * s + z
    return packed, sz, w[:n]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "n, k, g",
    [(576, 576, 32), (100, 64, 32), (192, 1536, 128), (130, 256, 64), (64, 512, 256), (33, 128, 32)],
)
def test_native_kernel_is_atens_kernel_bit_for_bit(n, k, g, dtype):
    """Row counts around the kernel's 12-row blocks and its MIN_ROWS switch; N not a multiple of 64
    (the last block's tail columns) or of 32 (a half-block); groups 32..256; float32 and bfloat16
    models (bf16 x in, bf16 y out: aten's own bf16 result)."""
    assert cpu_gemm.available()
    packed, sz, w = packed_weight(n, k, g)
    for m in (cpu_gemm.MIN_ROWS, 13, 24, 31, 32, 100, 255):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        y = torch.ops.lantern.int4pack_mm(x, packed, sz, g, n)
        assert y.shape == (m, n) and y.dtype == dtype
        aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, g, sz)[:, :n].to(dtype)
        assert torch.equal(y, aten), (m, n, k, g)
        assert rel_err(y, x.double() @ w.t()) < BF16, (m, n, k, g)


@needs_kernel
def test_the_op_picks_its_kernel_by_rows_inside():
    """Below MIN_ROWS the op calls aten's kernel, from MIN_ROWS on the native one (the kernel's
    panels are in use: its build is loaded); both give the reference's values within BF16."""
    packed, sz, w = packed_weight(100, 256, 32)
    for m in (1, cpu_gemm.MIN_ROWS - 1, cpu_gemm.MIN_ROWS, 2 * cpu_gemm.MIN_ROWS):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(1))
        assert rel_err(torch.ops.lantern.int4pack_mm(x, packed, sz, 32, 100), x.double() @ w.t()) < BF16
    calls = []
    lib = cpu_gemm._library()
    real = lib.lantern_int4pack_mm
    try:
        lib.lantern_int4pack_mm = lambda *a: calls.append(a[1]) or real(*a)
        for m in (cpu_gemm.MIN_ROWS - 1, cpu_gemm.MIN_ROWS, 40):
            torch.ops.lantern.int4pack_mm(torch.randn(m, 256), packed, sz, 32, 100)
    finally:
        lib.lantern_int4pack_mm = real
    assert calls == [cpu_gemm.MIN_ROWS, 40]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(576, 576), (49152, 64), (101, 208), (3, 2048)])
def test_native_int8_kernel_is_atens_kernel_bit_for_bit(n, k, dtype):
    """Row counts around its 6-row blocks; N not a multiple of its 4-row blocks (101, 3), K a multiple
    of 16 only (208); float32 and bfloat16 x; the reference: the int8 weight in float64."""
    gen = torch.Generator().manual_seed(n)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    ones = torch.ones(n, dtype=torch.bfloat16)
    for m in (1, 2, 5, 6, 7, 32, 100):
        x = torch.randn(m, k, generator=gen).to(dtype)
        y = torch.ops.lantern.int8pack_mm(x, w)
        assert y.shape == (m, n) and y.dtype == dtype
        aten = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), w, ones).to(dtype)
        assert torch.equal(y, aten), (m, n, k)
        assert rel_err(y, x.double() @ w.double().t()) < BF16, (m, n, k)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int8_layer_uses_the_kernel_for_batched_rows(dtype):
    """Int8PackLinear (per-channel int8, scaled after the product): 33 rows through the native kernel
    give what each row alone gives (aten's kernel), and the reference within BF16, in a float32 and
    a bfloat16 model."""
    rng = np.random.default_rng(3)
    n, k = 200, 96
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, (n, 1)).astype(np.float32)
    layer = ql.Int8PackLinear(AffineWeight(codes, scales, -128 * scales, 8, k, "test"), torch.device("cpu"), ErrorLog())
    assert layer.native_batched
    x = torch.randn(33, k, generator=torch.Generator().manual_seed(4)).to(dtype)
    calls = []
    lib = cpu_gemm._library()
    real = lib.lantern_int8pack_mm
    try:
        lib.lantern_int8pack_mm = lambda *a: calls.append(a[1]) or real(*a)
        y = layer(x)
    finally:
        lib.lantern_int8pack_mm = real
    assert calls == [33] and y.dtype == dtype
    assert torch.equal(y, torch.cat([layer(x[i : i + 1]) for i in range(33)]))
    w = layer.rows(torch.arange(n)).double()
    assert rel_err(y, x.double() @ w.t()) < BF16


@needs_kernel
def test_a_compiled_graph_calls_the_op_over_a_symbolic_row_count():
    """The op has a fake implementation, so inductor traces it; one graph serves row counts on both
    sides of MIN_ROWS (no guard on it) and gives the eager op's values."""
    from torch._dynamo.testing import CompileCounterWithBackend

    packed, sz, _ = packed_weight(72, 128, 32)
    counter = CompileCounterWithBackend("inductor")
    fn = lambda x: torch.ops.lantern.int4pack_mm(x, packed, sz, 32, 72).relu()
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for m in (3, 20, 40):
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m))
        assert torch.equal(compiled(x), fn(x)), m
    assert counter.frame_count == 1


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int4_layer_uses_the_kernel_for_batched_rows(dtype):
    """Int4PackLinear: 40 rows of a float32 or bfloat16 model go through the native kernel, and each
    row's output is what that row alone (aten's kernel) gives, bit for bit."""
    rng = np.random.default_rng(0)
    n, k, g = 72, 256, 32
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = rng.uniform(0.005, 0.02, (n, k // g)).astype(np.float32)
    biases = (-8 * scales + rng.normal(0, 0.01, scales.shape)).astype(np.float32)
    layer = ql.Int4PackLinear(AffineWeight(codes, scales, biases, 4, g, "test"), torch.device("cpu"), ErrorLog())
    assert layer.native_batched
    w = layer.rows(torch.arange(n)).double()  # the layer's weight, decoded from its own bytes
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(2)).to(dtype)
    calls = []
    lib = cpu_gemm._library()
    real = lib.lantern_int4pack_mm
    try:
        lib.lantern_int4pack_mm = lambda *a: calls.append(a[1]) or real(*a)
        y = layer(x)
    finally:
        lib.lantern_int4pack_mm = real
    assert calls == [40] and y.dtype == dtype
    assert torch.equal(y, torch.cat([layer(x[i : i + 1]) for i in range(40)]))
    assert rel_err(y, x.double() @ w.t()) < BF16


@pytest.mark.skipif(
    not packed_decode.int4pack_layout_ok(), reason="aten packs int4 differently on this (non-AVX-512) CPU"
)
def test_switched_off_the_layers_keep_atens_kernel(tmp_path):
    """LANTERN_CPU_KERNELS=0 (in a fresh process: availability is decided once): nothing is built
    (the kernel cache stays empty), the layer is not native, and its batched rows still give what
    each row alone gives."""
    code = """
import torch, numpy as np
from lantern.app.models.quant.affine import AffineWeight, ErrorLog
from lantern.backends.torch import cpu_gemm, quant_linear as ql
rng = np.random.default_rng(0)
codes = rng.integers(0, 16, (64, 128), dtype=np.uint8)
scales = rng.uniform(0.005, 0.02, (64, 4)).astype(np.float32)
layer = ql.Int4PackLinear(AffineWeight(codes, scales, -8 * scales, 4, 32, "t"), torch.device("cpu"), ErrorLog())
head = ql.Int8PackLinear(AffineWeight(codes, scales, -8 * scales, 4, 32, "t"), torch.device("cpu"), ErrorLog())
x = torch.randn(40, 128)
same = all(torch.equal(m(x), torch.cat([m(x[i : i + 1]) for i in range(40)])) for m in (layer, head))
print(cpu_gemm.available(), layer.native_batched or head.native_batched, same)
"""
    env = dict(os.environ, LANTERN_CPU_KERNELS="0", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "True"]
    assert not (tmp_path / "lantern").exists()


@needs_kernel
def test_a_bad_shape_or_dtype_is_refused_not_read_out_of_bounds():
    packed, sz, _ = packed_weight(64, 128, 32)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        torch.ops.lantern.int4pack_mm(torch.randn(16, 128).half(), packed, sz, 32, 64)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        torch.ops.lantern.int8pack_mm(torch.randn(16, 128).double(), torch.zeros(8, 128, dtype=torch.int8))
    with pytest.raises(ValueError, match="does not fit"):
        torch.ops.lantern.int4pack_mm(torch.randn(16, 256), packed, sz, 32, 64)
    with pytest.raises(ValueError, match="does not fit"):
        torch.ops.lantern.int4pack_mm(torch.randn(16, 128), packed, sz, 32, 65)


@needs_kernel
def test_a_fresh_cache_builds_the_library_once(tmp_path):
    """With an empty kernel cache (a fresh machine) the first use compiles the C source into it, and
    a second process loads that file instead of compiling again."""
    code = """
import torch
from lantern.backends.torch import cpu_gemm, native_build
w = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
x = torch.randn(5, 64)
ok = torch.equal(torch.ops.lantern.int8pack_mm(x, w), torch.ops.aten._weight_int8pack_mm(
    x.to(torch.bfloat16), w, torch.ones(40, dtype=torch.bfloat16)).float())
print(cpu_gemm.available(), ok)
"""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("LANTERN_CPU_KERNELS", None)
    stamps = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["True", "True"]
        built = list((tmp_path / "lantern" / "cpu_kernels").glob("cpu_quant_gemm-*.so"))
        assert len(built) == 1
        stamps.append(built[0].stat().st_mtime_ns)
    assert stamps[0] == stamps[1]
