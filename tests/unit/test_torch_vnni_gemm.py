"""cpu_vnni_gemm / vnni_linear: the int8-dot-product CPU GEMM against references written from its
documented math, its layout against the source weights, and the layer's paths.

References: (1) the exact product x @ W.T in float64 with W the source weights (`AffineWeight.dequantize`);
the kernel quantizes x in two int8 levels per 32 columns (~15 bits), so in float32 it is within
1e-4 normwise of the stored weight (float16 scales; measured ~2e-5), and a wrong nibble, lane,
group or tail column costs >= 10%.
(2) The same math in float64 from x's two levels computed here in float32 as the C code documents
(d = max|x| / 127, x1 = round(x / d), x2 = round(256 * (x - d * x1) / d)): within 1e-6, which pins
the scheme itself (one level, or another rounding, misses it by >= 1e-4).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lantern.app.models.quant.affine import AffineWeight, ErrorLog
from lantern.backends.torch import cpu_vnni_gemm, native_build, vnni_linear
from lantern.backends.torch import quant_linear as ql
from lantern.backends.torch.packed_decode import DENSE_ROWS

BOUND = 2.0**-6  # what the CPU layers are held to (x and y in bf16: their rounding dominates)

needs_vnni = pytest.mark.skipif(
    not (native_build.cpu_has_avx512() and "avx512_vnni" in native_build.cpu_flags()),
    reason="the VNNI kernel is built for x86-64 CPUs with AVX512-VNNI only",
)


def affine(n: int, k: int, bits: int, g: int, seed: int = 0, scale: float = 1.0) -> AffineWeight:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
    scales = (rng.uniform(0.005, 0.02, (n, k // g)) * scale).astype(np.float32)
    biases = (-(2 ** (bits - 1)) * scales + rng.normal(0, 0.01 * scale, scales.shape)).astype(np.float32)
    return AffineWeight(codes, scales, biases, bits, g, "test")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def scheme_reference(x: torch.Tensor, layer: vnni_linear.VnniLinear) -> torch.Tensor:
    """The kernel's documented math in float64: x quantized per 32 columns in two int8 levels in
    float32 (as the C code does), the stored weight's scales and biases."""
    m, k = x.shape
    xg = x.float().view(m, k // 32, 32)
    d = xg.abs().amax(dim=-1, keepdim=True) / 127.0  # float32, like the kernel
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    x1 = torch.round(xg * inv)  # half to even, as the kernel's rounding
    rest = torch.addcmul(xg, x1, d, value=-1.0)  # x - d * x1 (a fused multiply-add: one rounding)
    x2 = torch.round(rest * inv * 256.0).clamp(-128, 127)
    xq = (x1.double() * 256 + x2.double()) * (d.double() / 256)
    w = layer.rows(torch.arange(layer.out_features)).double()  # the stored weight (out_scale applied)
    return xq.view(m, k) @ w.t()


@needs_vnni
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "bits, g, n, k",
    [(4, 32, 576, 576), (4, 64, 100, 512), (4, 128, 33, 256), (8, 32, 200, 128), (8, 256, 50, 256), (6, 32, 17, 64)],
)
def test_kernel_against_the_exact_product_and_its_own_scheme(bits, g, n, k, dtype):
    """Row counts around the 4-row tiles; N not a multiple of 16 (a masked tail) or of 48 (a narrower
    last tile); groups 32..256 and per-channel; 4- and 8-bit codes; float32 and bfloat16 x."""
    w = affine(n, k, bits, g, seed=n + k)
    layer = ql.quantized_linear(w, None, "cpu", dtype, ErrorLog(), kernel="vnni")
    exact = torch.from_numpy(w.dequantize()).double()
    stored = layer.rows(torch.arange(n)).double()
    for m in (1, 3, 4, 5, 13, 33, DENSE_ROWS - 1):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        y = layer(x)
        assert y.shape == (m, n) and y.dtype == dtype
        assert rel_err(y, x.double() @ exact.t()) < BOUND, (m, bits, g)
        if dtype == torch.float32:  # against the stored weight (float16 scales): x's two levels only
            assert rel_err(y, x.double() @ stored.t()) < 1e-4, (m, bits, g)
        tol = 1e-6 if dtype == torch.float32 else 2**-8  # bf16 output: its own rounding
        assert rel_err(y, scheme_reference(x, layer)) < tol, (m, bits, g)


@needs_vnni
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_its_batch(dtype):
    """Each row alone gives, bit for bit, what it gives among 40 or 100 others: the kernel computes
    rows independently and splits the outputs, not K, among threads."""
    layer = ql.quantized_linear(affine(300, 576, 4, 32), None, "cpu", dtype, ErrorLog(), kernel="vnni")
    x = torch.randn(100, 576, generator=torch.Generator().manual_seed(5)).to(dtype)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(100)])
    assert torch.equal(layer(x), alone)
    assert torch.equal(layer(x[:40]), alone[:40])


@needs_vnni
@pytest.mark.parametrize("bits, g", [(2, 32), (3, 64), (4, 32), (5, 32), (8, 128), (8, 64)])
def test_formats_map_exactly_but_for_float16_scales(bits, g):
    """Codes of any width up to 8 and groups that are multiples of 32 are stored as they are: the
    decoded rows are the source's values with its scales and biases rounded to float16 (and the
    power of two that keeps them in range undone exactly)."""
    w = affine(70, 256, bits, g, seed=bits)
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, "cpu", torch.float32, errors, kernel="vnni")
    assert layer.bits == (4 if bits <= 4 else 8) and layer.group_size == g and not layer.requantized
    shift = torch.log2(layer.out_scale).item()
    s16 = torch.from_numpy(w.scales * 2.0**-shift).half().float() * 2.0**shift
    b16 = torch.from_numpy(w.biases * 2.0**-shift).half().float() * 2.0**shift
    want = torch.from_numpy(w.codes).float().view(70, -1, g) * s16[..., None] + b16[..., None]
    got = layer.rows(torch.arange(70))
    assert torch.allclose(got, want.view(70, 256), rtol=1e-6, atol=1e-9)
    ids = torch.tensor([0, 69, 15, 16, 33])
    assert torch.equal(layer.rows(ids), got[ids])
    assert [target for _, target in errors.worst] == [layer.target]  # f16 rounding of random scales


@needs_vnni
def test_group16_is_requantized_and_logged():
    w = affine(40, 64, 3, 16)
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, "cpu", torch.float32, errors, kernel="vnni")
    assert layer.requantized and layer.group_size == 32
    ((source, target),) = errors.worst
    assert "requantized" in target and errors.worst[(source, target)][0] < 0.1


@needs_vnni
def test_scales_outside_float16_range_keep_their_precision():
    """Scales of ~1e5 or ~1e-7 (float16 overflows or goes subnormal there) are shifted by a power of
    two into range: the stored weight stays within float16's relative rounding of the source."""
    for scale in (1e7, 1e-5):
        w = affine(48, 128, 4, 32, scale=scale)
        layer = ql.quantized_linear(w, None, "cpu", torch.float32, ErrorLog(), kernel="vnni")
        exact = torch.from_numpy(w.dequantize()).double()
        assert rel_err(layer.rows(torch.arange(48)), exact) < 1e-3
        x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
        assert rel_err(layer(x), x.double() @ exact.t()) < BOUND


@needs_vnni
@pytest.mark.parametrize("bits", [4, 8])
def test_prefill_rows_take_the_dense_path_with_the_stored_weight(bits, monkeypatch):
    """From DENSE_ROWS rows on, the weight is decoded in chunks (chunk boundaries inside the matrix)
    into a float GEMM: x @ rows().T, no activation quantization."""
    from lantern.backends.torch import packed_decode

    monkeypatch.setattr(packed_decode, "DENSE_CHUNK", 64 * 128)  # 64 rows per chunk: 4 chunks, the last partial
    layer = ql.quantized_linear(affine(200, 128, bits, 32), None, "cpu", torch.float32, ErrorLog(), kernel="vnni")
    x = torch.randn(DENSE_ROWS + 3, 128, generator=torch.Generator().manual_seed(1))
    want = x.double() @ layer.rows(torch.arange(200)).double().t()
    assert rel_err(layer(x), want) < 1e-6


@needs_vnni
@pytest.mark.parametrize("bits,g", [(4, 32), (4, 128), (8, 64)])
def test_the_native_prefill_decoder_holds_the_stored_weight(bits, g):
    """torch.ops.lantern.vnni_decode (one pass, straight into the GEMM's dtype) against the rows the
    torch row decoder (decode_rows) gives, over ranges that start and end inside blocks, with scales far
    outside float16's range (out_scale folded in): float32 bit for bit, bfloat16 and float16 their
    rounding, W.T laid out for the GEMM; a range past the weight is refused."""
    assert cpu_vnni_gemm.available()  # builds and loads the ops
    w = affine(200, 256, bits, g, seed=7, scale=1e6)
    codes = cpu_vnni_gemm.pack_codes(w.codes, bits)
    scales, out_scale = cpu_vnni_gemm.pack_scales(np.asarray(w.scales), np.asarray(w.biases))
    assert out_scale.item() != 1.0
    held = cpu_vnni_gemm.decode_rows(codes, scales, out_scale, torch.arange(200), 256, g, bits)
    for start, stop in ((0, 200), (48, 131), (192, 200)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            got = cpu_vnni_gemm.decode_block_rows(codes, scales, out_scale, start, stop, 256, g, bits, dtype)
            assert got.dtype == dtype and got.stride(0) == 1  # W.T read in place
            assert torch.equal(got, held[start:stop].to(dtype))
    with pytest.raises(ValueError, match="do not fit"):
        torch.ops.lantern.vnni_decode(codes, scales, out_scale, 256, g, bits, 10, 4, torch.float32)  # 13 blocks


@needs_vnni
def test_embedding_rows_and_tied_logits():
    w = affine(1000, 64, 8, 32)
    emb = ql.quantized_embedding(w, "cpu", torch.bfloat16, ErrorLog(), kernel="vnni")
    ids = torch.tensor([[0, 999, 500], [17, 16, 15]])
    rows = emb(ids)
    assert rows.shape == (2, 3, 64) and rows.dtype == torch.bfloat16
    exact = torch.from_numpy(w.dequantize())
    assert rel_err(rows.view(6, 64), exact[ids.view(-1)].double()) < 2**-8
    h = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert rel_err(emb.logits(h), h.double() @ exact.double().t()) < BOUND


@needs_vnni
def test_a_compiled_graph_calls_the_op_over_a_symbolic_row_count():
    """The op has a fake implementation, so inductor traces it: one graph for 1, 20 and 40 rows, the
    eager values; the layer's out_scale is a tensor, so layers differing only in it share the graph."""
    from torch._dynamo.testing import CompileCounterWithBackend

    cpu = torch.device("cpu")
    a, b = (vnni_linear.VnniLinear(affine(72, 128, 4, 32, seed=s, scale=c), cpu) for s, c in ((1, 1), (2, 50)))
    assert not torch.equal(a.out_scale, b.out_scale)
    counter = CompileCounterWithBackend("inductor")
    fn = lambda layer, x: layer(x).relu()
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for m in (2, 20, 40):
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m))
        for layer in (a, b):
            assert torch.equal(compiled(layer, x), fn(layer, x)), m
    assert counter.frame_count == 1


@needs_vnni
def test_a_bad_shape_or_dtype_is_refused_not_read_out_of_bounds():
    layer = ql.quantized_linear(affine(64, 128, 4, 32), None, "cpu", torch.float32, ErrorLog(), kernel="vnni")
    args = (layer.codes, layer.scales, layer.out_scale, 32)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        cpu_vnni_gemm.vnni_mm(torch.randn(3, 128).half(), *args, 64, 4)
    for x, n, bits in ((torch.randn(3, 256), 64, 4), (torch.randn(3, 128), 65, 4), (torch.randn(3, 128), 64, 8)):
        with pytest.raises(ValueError, match="does not fit"):
            cpu_vnni_gemm.vnni_mm(x, *args, n, bits)
    assert layer(torch.randn(0, 128)).shape == (0, 64)


@needs_vnni
def test_the_layers_choose_it_and_switched_off_they_do_not(tmp_path):
    """With the kernels on, select_kernel picks "vnni" for 2..8-bit weights of width a multiple of 32;
    with LANTERN_CPU_KERNELS=0 (a fresh process) nothing is built and aten's kernels serve."""
    assert ql.select_kernel(affine(16, 64, 4, 32), "cpu") == "vnni"
    assert ql.select_kernel(affine(16, 64, 8, 64), "cpu") == "vnni"
    assert ql.select_kernel(affine(16, 48, 4, 16), "cpu") != "vnni"  # width 48: not a multiple of 32
    code = """
import numpy as np
from lantern.app.models.quant.affine import AffineWeight
from lantern.backends.torch import quant_linear as ql
w = AffineWeight(np.zeros((16, 64), np.uint8), np.ones((16, 2), np.float32), np.zeros((16, 2), np.float32), 4, 32, "t")
print(ql.select_kernel(w, "cpu"))
"""
    env = dict(os.environ, LANTERN_CPU_KERNELS="0", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["int4pack"]
    assert not (tmp_path / "lantern").exists()
