"""quant_linear.py: every kernel path against the dequantize-then-matmul reference.

Reference: F.linear in float64 on `AffineWeight.dequantize()` / `Fp8Weight.dequantize()` (the lead's
format code, not the layers'). Tolerances, as normwise relative errors ||y - ref|| / ||ref||:
- BF16 = 2**-6 for the CPU kernels and any bf16 caller. With bf16 activations the layer rounds x to bf16
  (unit roundoff u = 2**-8), the int4 op forms each weight in bf16 (u) from bf16 scale/zero (about u each),
  and rounds its output to bf16 (u): independent errors of at most u each, about 0.5% in total on random
  data, so 2**-6 (1.6%) leaves a 3x margin and still fails on any wrong code, scale, row or group (>= 10%).
- F32 = 1e-5 for the Triton path with float32 activations and scales (f32 accumulation of 256 terms).
- Requantized modes: the same bound against the requantized weight (`affine.requantize`, which the layer
  must then hold exactly), and 1.5x the logged relative weight error + BF16 against the source (for
  random x the output's relative error is the weight's).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the CUDA path runs on CPU

import importlib.util
import logging

import numpy as np
import pytest
import torch.nn.functional as F

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight, quantize_affine, requantize
from lantern.backends.torch import packed_decode
from lantern.backends.torch import quant_linear as ql

BF16 = 2.0**-6
F32 = 1e-5
N, K = 72, 256  # N not a multiple of 64 (int4pack pads to 128); K holds 2..16 groups
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture
def triton_device() -> str:
    """Where the Triton layer runs: the GPU, else the CPU under the interpreter (when triton_quant was
    first imported after TRITON_INTERPRET=1 was set, which this module does at import)."""
    if torch.cuda.is_available():
        return "cuda"
    from triton.runtime.interpreter import InterpretedFunction

    from lantern.backends.torch.kernels import triton_quant

    if not isinstance(triton_quant._gemm_kernel, InterpretedFunction):
        pytest.skip("triton_quant was imported before TRITON_INTERPRET=1 was set")
    return "cpu"


def affine(rows: int, cols: int, bits: int, group: int, seed: int = 0, source: str = "") -> AffineWeight:
    """Random codes with arbitrary positive scales and biases (like Q4_1/Q4_K/AWQ: a min and a step)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, (rows, cols), dtype=np.uint8)
    scales = rng.uniform(0.005, 0.02, (rows, cols // group)).astype(np.float32)
    biases = (-scales * (1 << (bits - 1)) + rng.normal(0, 0.01, scales.shape)).astype(np.float32)
    return AffineWeight(codes, scales, biases, bits, group, source or f"test {bits}-bit g{group}")


VNNI_AVAILABLE = ql.cpu_vnni_gemm.available  # the real check (aten_kernels switches it off per test)
# aten lays int4pack weights out per CPU capability; the decoders read its AVX-512 layout, so on other
# CPUs 4-bit weights take int8 per channel (quant_linear._int4pack_usable) and the int4pack layer is unused.
INT4PACK = packed_decode.int4pack_layout_ok()
needs_int4pack = pytest.mark.skipif(not INT4PACK, reason="aten packs int4 differently on this (non-AVX-512) CPU")


@pytest.fixture(autouse=True)
def aten_kernels(monkeypatch):
    """These tests hold the aten-kernel layers (int4pack, int8pack), which serve CPUs without
    AVX512-VNNI: the VNNI kernel is switched off here as on such a CPU (test_torch_vnni_gemm.py
    covers it)."""
    monkeypatch.setattr(ql.cpu_vnni_gemm, "available", lambda: False)


def reference(x: torch.Tensor, w: np.ndarray, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = F.linear(x.double(), torch.from_numpy(w).double())
    return y + bias.double() if bias is not None else y


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def inputs(m: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("group", [16, 32, 64, 128])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_cpu_linear_matches_dequantized_reference(bits: int, group: int) -> None:
    w = affine(N, K, bits, group, seed=bits * 1000 + group)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(7))
    errors = ErrorLog()
    layer = ql.quantized_linear(w, bias, "cpu", torch.bfloat16, errors)
    int4 = bits <= 4 and INT4PACK  # elsewhere 4-bit weights take int8 per channel too
    exact = int4 and group >= 32  # int4pack holds <= 4-bit codes of groups 32..256 as they are
    assert ql.select_kernel(w, "cpu") == ("int4pack" if int4 else "int8pack")
    if exact:
        target = f"int4 g{group} (bf16 scales)"
        held = w
    else:
        target = "int4 g32 (requantized, bf16 scales)" if int4 else "int8 per-channel (requantized)"
        held, req_error = requantize(w, 4, 32) if int4 else requantize(w, 8, 0, symmetric=True)
    assert list(errors.worst) == [(w.source, target)]
    logged = errors.worst[(w.source, target)][0]
    if exact:
        assert 0 < logged < 2**-8  # bf16 storage of scale and zero only
    else:  # the requantization, plus at most the bf16 storage of its scales
        assert req_error * 0.99 <= logged <= req_error + 2**-8
    for m in (1, 37):
        for dtype in (torch.float32, torch.bfloat16):
            x = inputs(m, K, dtype, seed=m)
            y = layer(x)
            assert y.dtype == dtype and y.shape == (m, N)
            assert rel(y, reference(x, held.dequantize(), bias)) < BF16
            if not exact:
                assert rel(y, reference(x, w.dequantize(), bias)) < 1.5 * logged + BF16


@pytest.mark.parametrize("bits", [8, 6])
def test_int8_is_exact_for_per_channel_symmetric(bits: int) -> None:
    """A per-channel symmetric source (`--isq q8`, or 6-bit with zero point 32) maps with no error."""
    dense = np.random.default_rng(3).normal(0, 0.05, (N, K)).astype(np.float32)
    w = quantize_affine(dense, bits, K, symmetric=True, source=f"sym {bits}")
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, "cpu", torch.float32, errors)
    assert isinstance(layer, ql.Int8PackLinear)
    assert errors.worst == {}
    emb = ql.quantized_embedding(w, "cpu", torch.float32, errors)
    ids = torch.tensor([0, 5, 71, 5])
    np.testing.assert_allclose(emb(ids).numpy(), w.dequantize()[ids.numpy()], rtol=1e-6, atol=1e-7)
    x = inputs(37, K, torch.float32)
    assert rel(layer(x), reference(x, w.dequantize())) < 2**-7  # only x's and y's bf16 rounding


@needs_int4pack
def test_int4_embedding_rows_and_tied_logits() -> None:
    w = affine(200, K, 4, 32, seed=11)  # 200 rows: the last 64-row block is partly padding
    errors = ErrorLog()
    emb = ql.quantized_embedding(w, "cpu", torch.float32, errors)
    ids = torch.tensor([[0, 31, 32, 63], [64, 130, 199, 31]])
    rows = emb(ids)
    assert rows.shape == (2, 4, K) and rows.dtype == torch.float32
    want = w.dequantize()[ids.numpy()]
    # bf16 storage of scale s and zero z = b + 8s: |error| <= 2**-8 (|c - 8| s + |b + 8s|) per weight
    c = w.codes[ids.numpy()].astype(np.float32).reshape(2, 4, -1, 32)
    s = w.scales[ids.numpy()][..., None]
    z = (w.biases + 8 * w.scales)[ids.numpy()][..., None]
    bound = (2.0**-8 * (np.abs(c - 8) * s + np.abs(z))).reshape(want.shape) * 1.01 + 1e-7
    assert np.all(np.abs(rows.numpy() - want) <= bound)
    assert emb(ids[0]).dtype == torch.float32
    assert ql.quantized_embedding(w, "cpu", torch.bfloat16, ErrorLog())(ids).dtype == torch.bfloat16
    # logits read the same table with the linear kernel; the decoded rows are that kernel's weight
    h = inputs(5, K, torch.float32)
    linear = ql.quantized_linear(w, None, "cpu", torch.float32, ErrorLog())
    assert torch.equal(emb.logits(h), linear(h))
    table = emb(torch.arange(200))
    assert rel(emb.logits(h), F.linear(h.double(), table.double())) < BF16
    assert rel(emb.logits(h), reference(h, w.dequantize())) < BF16
    assert ql.quantized_bytes(emb) == ql.quantized_bytes(linear)  # one table, not two


def test_int8_embedding_rows_are_the_requantized_rows() -> None:
    w = affine(N, K, 6, 16, seed=5)
    emb = ql.quantized_embedding(w, "cpu", torch.float32, ErrorLog())
    held = requantize(w, 8, 0, symmetric=True)[0].dequantize()
    ids = torch.tensor([3, 0, 71])
    np.testing.assert_allclose(emb(ids).numpy(), held[ids.numpy()], rtol=1e-6, atol=1e-7)
    h = inputs(4, K, torch.bfloat16)
    assert emb.logits(h).dtype == torch.bfloat16
    assert rel(emb.logits(h), reference(h, held)) < BF16


@needs_int4pack
def test_large_groups_split_exactly() -> None:
    """A per-channel 4-bit weight (g = K = 512) becomes int4 g256 with the same values."""
    w = affine(64, 512, 4, 512, seed=9)
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, "cpu", torch.float32, errors)
    assert layer.group_size == 256
    assert list(errors.worst) == [(w.source, "int4 g256 (bf16 scales)")]
    x = inputs(3, 512, torch.float32)
    assert rel(layer(x), reference(x, w.dequantize())) < BF16


def test_shapes_batch_dims_and_empty_batch() -> None:
    w = affine(5, 64, 4, 32)  # N = 5: 59 of the 64 packed rows are padding
    layer = ql.quantized_linear(w, None, "cpu", torch.float32, ErrorLog())
    x = torch.randn(2, 3, 64)
    y = layer(x)
    assert y.shape == (2, 3, 5)
    assert rel(y, reference(x.reshape(6, 64), w.dequantize()).reshape(2, 3, 5)) < BF16
    assert layer(torch.randn(0, 64)).shape == (0, 5)


@needs_int4pack
def test_stacked_linear_of_mixed_modes_and_bytes() -> None:
    q4, q6 = affine(64, K, 4, 32, seed=1), affine(N, K, 6, 16, seed=2)  # Q4_K_M mixes Q4_K and Q6_K
    errors = ErrorLog()
    parts = [
        ql.quantized_linear(q4, None, "cpu", torch.bfloat16, errors),
        ql.quantized_linear(q6, None, "cpu", torch.bfloat16, errors),
    ]
    stacked = ql.stacked_linear(parts)
    x = inputs(37, K, torch.bfloat16)
    y = stacked(x)
    assert y.shape == (37, 64 + N) and y.dtype == torch.bfloat16
    assert torch.equal(y, torch.cat([parts[0](x), parts[1](x)], dim=-1))
    held6 = requantize(q6, 8, 0, symmetric=True)[0].dequantize()
    assert rel(y, reference(x, np.concatenate([q4.dequantize(), held6]))) < BF16
    # int4: K/2 bytes per row + bf16 (scale, zero) per group; int8: K bytes per row + f32 scale + bf16 one
    assert ql.quantized_bytes(parts[0]) == 64 * K // 2 + 64 * (K // 32) * 4
    assert ql.quantized_bytes(parts[1]) == N * K + N * 4 + N * 2
    assert ql.quantized_bytes(stacked) == ql.quantized_bytes(parts[0]) + ql.quantized_bytes(parts[1])


def fp8(rows: int, cols: int, scale: np.ndarray, block: tuple[int, int] | None, source: str) -> Fp8Weight:
    data = np.random.default_rng(4).integers(0, 256, (rows, cols), dtype=np.uint8)
    data[(data & 0x7F) == 0x7F] = 0x40  # no NaN patterns
    return Fp8Weight(data, scale.astype(np.float32), block, source)


@pytest.mark.parametrize("vnni", [True, False])
@pytest.mark.parametrize("block", [None, (32, 32)])
def test_fp8_is_requantized_to_8_bits_on_cpu(block, vnni, monkeypatch, caplog) -> None:
    """No FP8 matmul on a CPU: the e4m3 values are requantized to 8-bit codes (g32 for the VNNI layers,
    per-channel symmetric int8 for aten's int8pack, which holds that exactly), the error logged, one byte
    a weight; the layer computes on exactly `fp8_as_affine`'s weight. A width neither takes: dequantized."""
    from lantern.app.models.quant.affine import fp8_as_affine

    if vnni and not VNNI_AVAILABLE():
        pytest.skip("no VNNI kernels on this machine")
    monkeypatch.setattr(ql.cpu_vnni_gemm, "available", VNNI_AVAILABLE if vnni else lambda: False)
    scale = np.array(0.01) if block is None else np.random.default_rng(5).uniform(0.005, 0.02, (3, 8))
    w = fp8(N, K, scale, block, f"fp8 test {block}")
    mode = (8, 32, False) if vnni else (8, 0, True)
    assert ql.select_kernel(w, "cpu") == ("vnni" if vnni else "int8pack")
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, "cpu", torch.bfloat16, errors)
    target = "8-bit g32 (requantized)" if vnni else "8-bit per-channel (requantized)"
    held, error = fp8_as_affine(w, *mode)
    assert 0 < errors.worst[(w.source, target)][0] == error < 0.01  # (VNNI adds its float16 scales' rounding)
    if not vnni:  # int8pack holds the per-channel codes exactly: nothing requantized twice
        assert set(errors.worst) == {(w.source, target)}
    assert ql.quantized_bytes(layer) < 1.3 * N * K  # one byte a weight, plus scales and row padding (bf16: 2)
    for dtype in (torch.float32, torch.bfloat16):
        x = inputs(37, K, dtype)
        assert layer(x).dtype == dtype
        assert rel(layer(x), reference(x, held.dequantize())) < BF16
    narrow = fp8(N, 40, np.array(0.01), None, "narrow")  # 40 columns: no 8-bit CPU layout
    assert ql.select_kernel(narrow, "cpu") == "dense"
    errors = ErrorLog()
    ql.quantized_linear(narrow, None, "cpu", torch.float32, errors)
    with caplog.at_level(logging.INFO):
        errors.report("torch")
    assert any("dequantized" in r.getMessage() and "narrow" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_scaled_mm_layer_math(per_channel) -> None:
    """The Hopper path's arithmetic (torch._scaled_mm also runs on CPU in recent torch)."""
    scale = np.random.default_rng(6).uniform(0.005, 0.02, (64, 1)) if per_channel else np.array(0.01)
    w = fp8(64, K, scale, None, "fp8 per-channel" if per_channel else "fp8 per-tensor")
    layer = ql.quantized_linear(w, None, "cpu", torch.bfloat16, ErrorLog(), kernel="fp8")
    x = inputs(37, K, torch.bfloat16)
    # activations rounded to e4m3 (3 mantissa bits: u = 2**-4) dominate the error: ~2**-4 / sqrt(3)
    assert rel(layer(x), reference(x, w.dequantize())) < 0.06
    # Row-wise activation scales: a row's result does not depend on what else is in the batch.
    loud = x.clone()
    loud[0] *= 1000
    torch.testing.assert_close(layer(loud)[1:], layer(x)[1:], rtol=0, atol=0)
    np.testing.assert_allclose(
        ql.quantized_embedding(w, "cpu", torch.float32, ErrorLog(), kernel="fp8")(torch.tensor([2, 9])).numpy(),
        w.dequantize()[[2, 9]],
        rtol=1e-6,
    )


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize(
    "scale, block, group",
    [
        (np.array([[0.01, 0.02]]), (128, 128), 128),  # DeepSeek-V3 / Qwen3-FP8: 128x128 blocks (72 rows: one)
        (np.random.default_rng(7).uniform(0.005, 0.02, (3, 8)), (32, 32), 32),
        (np.random.default_rng(8).uniform(0.005, 0.02, (N, 1)), None, 128),  # per-channel (an A100)
        (np.array(0.01), None, 128),  # per-tensor
    ],
)
def test_fp8_triton_path_keeps_the_bytes(scale, block, group, triton_device: str) -> None:
    """FP8 weights that torch._scaled_mm does not take run the e4m3 Triton kernels on their own bytes,
    each row's scales laid out per group of input columns: exact (rows equal the dequantized weight),
    float32 GEMV and GEMM to F32, one byte a weight."""
    w = fp8(N, K, scale, block, f"fp8 {block}")
    errors = ErrorLog()
    layer = ql.quantized_linear(w, None, triton_device, torch.float32, errors, kernel="triton")
    assert (layer.code, layer.bits, layer.group_size) == ("e4m3", 8, group) and layer.biases is None
    assert tuple(layer.packed.shape) == (N, K) and layer.packed.dtype == torch.uint8
    assert list(errors.worst) == [] and not errors.notes
    ids = torch.tensor([0, 33, 71])
    np.testing.assert_array_equal(layer.rows(ids.to(triton_device)).cpu().numpy(), w.dequantize()[ids.numpy()])
    for m in (1, 37):
        x = inputs(m, K, torch.float32).to(triton_device)
        assert rel(layer(x).cpu(), reference(x.cpu(), w.dequantize())) < F32


def test_fp8_groups_lay_scales_out_per_row_and_group() -> None:
    """fp8_groups: a 2x2 grid of 128x128 block scales over a [200, 256] weight gives rows 0-127 the
    first block row's two scales and rows 128-199 the second's; a block width that is no multiple
    of 32 or a ragged last column block has no layout."""
    from lantern.backends.torch.triton_linear import fp8_groups

    blocks = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    group, scales = fp8_groups(fp8(200, 256, blocks, (128, 128), "b"))
    assert group == 128 and scales.shape == (200, 2)
    assert (scales[:128] == [1.0, 2.0]).all() and (scales[128:] == [3.0, 4.0]).all()
    group, scales = fp8_groups(fp8(8, 256, np.array([[5.0]]), (128, 256), "wide"))
    assert group == 128 and scales.shape == (8, 2) and (scales == 5.0).all()  # two groups share a 256-wide block
    assert fp8_groups(fp8(8, 256, np.array([[5.0, 6.0]]), (128, 256), "bad")) is None  # scales of another grid
    assert fp8_groups(fp8(8, 96, np.ones((1, 2)), (128, 48), "b48")) is None
    assert fp8_groups(fp8(8, 200, np.ones((1, 2)), (128, 128), "ragged")) is None
    group, scales = fp8_groups(fp8(8, 96, np.arange(8, dtype=np.float32).reshape(8, 1), None, "pc"))
    assert group == 32 and scales.shape == (8, 3) and (scales[:, 2] == np.arange(8)).all()


def test_kernel_selection(monkeypatch) -> None:
    assert ql.select_kernel(affine(8, 64, 4, 32), "cuda") == "triton"
    assert ql.select_kernel(affine(8, 64, 6, 16), torch.device("cuda", 1)) == "triton"
    assert ql.select_kernel(affine(8, 48, 4, 16), "cpu") == "dense"  # no group of 32 fits K = 48
    per_tensor = fp8(64, 64, np.array(0.5), None, "pt")
    blocks = fp8(64, 64, np.ones((1, 1)), (128, 128), "blocks")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert ql.select_kernel(per_tensor, "cuda") == "fp8"
    assert ql.select_kernel(fp8(64, 64, np.ones((64, 1)), None, "pc"), "cuda") == "fp8"
    assert ql.select_kernel(blocks, "cuda") == "dense"
    assert ql.select_kernel(fp8(256, 256, np.ones((2, 2)), (128, 128), "fits"), "cuda") == "triton"  # e4m3 kernel
    assert ql.select_kernel(fp8(64, 96, np.ones((1, 2)), (128, 48), "b48"), "cuda") == "dense"  # no 32-multiple
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert ql.select_kernel(per_tensor, "cuda") == "triton"  # no FP8 matmul: the bytes through Triton


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize(
    "bits,group,label",
    [
        (4, 32, "4-bit g32"),
        (2, 64, "4-bit g64"),  # 2-bit codes widen exactly
        (8, 128, "8-bit g128"),
        (5, 32, "8-bit g32"),  # 5-bit codes widen exactly
        (3, 16, "4-bit g32 (requantized, float32 scales)"),
        (6, 16, "8-bit g32 (requantized, float32 scales)"),
    ],
)
def test_triton_path(bits: int, group: int, label: str, triton_device: str) -> None:
    """The CUDA layer with the device forced to CPU (Triton's interpreter), float32: exact modes log nothing."""
    w = affine(N, K, bits, group, seed=bits + group)
    errors = ErrorLog()
    device = triton_device
    layer = ql.quantized_linear(w, torch.ones(N), device, torch.float32, errors, kernel="triton")
    requantized = "requantized" in label
    held = requantize(w, 4 if bits <= 4 else 8, 32)[0] if requantized else w
    assert layer.bits == (4 if bits <= 4 else 8) and label.startswith(f"{layer.bits}-bit g{layer.group_size}")
    assert list(errors.worst) == ([(w.source, label)] if requantized else [])
    for m in (1, 37) if bits == 4 else (1, 5):  # GEMV (M <= 4) and GEMM
        x = inputs(m, K, torch.float32).to(device)
        y = layer(x)
        assert y.dtype == torch.float32
        assert rel(y.cpu(), reference(x.cpu(), held.dequantize(), torch.ones(N))) < F32
    emb = ql.quantized_embedding(w, device, torch.float32, ErrorLog(), kernel="triton")
    ids = torch.tensor([0, 33, 71])
    np.testing.assert_allclose(emb(ids.to(device)).cpu().numpy(), held.dequantize()[ids.numpy()], rtol=1e-6, atol=1e-6)


def fp4_weight(mode: str, global_scale: float, offset: int = 12, seed: int = 0) -> AffineWeight:
    """A random MXFP4 / NVFP4 weight in the shared 5-bit form: MxWeight.portable() (offset 12), or as the
    GGUF reader writes it (offset 16: codes 16 + twice the value, bias -16 steps)."""
    from lantern.app.models.quant.microscaled import MODES, MxWeight

    rng = np.random.default_rng(seed)
    group = MODES[mode][1]
    packed = rng.integers(0, 2**32, (N, K // 8), dtype=np.uint32)
    low, high = (118, 128) if mode == "mxfp4" else (0x28, 0x50)  # e8m0 2^-9..2^0; e4m3 0.03..2.5
    scales = rng.integers(low, high, (N, K // group)).astype(np.uint8)
    w = MxWeight(mode, packed, scales, f"test {mode}", global_scale).portable()
    if offset != 12:
        codes = w.codes + np.uint8(offset - 12)
        w = AffineWeight(codes, w.scales, np.float32(-offset) * w.scales, 5, group, w.source)
    return w


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize(
    "mode,global_scale,offset,held",
    [
        ("mxfp4", 1.0, 12, torch.bfloat16),  # powers of two: exact in bf16
        ("mxfp4", 1.0, 16, torch.bfloat16),  # a GGUF MXFP4 tensor
        ("nvfp4", 1.0, 12, torch.bfloat16),  # e4m3 scales: exact in bf16 (MLX's nvfp4 folders)
        ("nvfp4", 0.37, 16, torch.float32),  # times a global scale (compressed-tensors, ModelOpt)
    ],
)
def test_triton_path_keeps_fp4_at_4_bits(mode, global_scale, offset, held, triton_device: str) -> None:
    """An fp4 weight (from any reader) takes the e2m1 kernel with its own groups: 4-bit nibbles, the
    scales exactly (in the model's dtype where that holds them), nothing requantized or logged."""
    w = fp4_weight(mode, global_scale, offset)
    device = triton_device
    for dtype in (torch.bfloat16, torch.float32):
        errors = ErrorLog()
        layer = ql.quantized_linear(w, None, device, dtype, errors, kernel="triton")
        assert (layer.code, layer.bits, layer.group_size) == ("e2m1", 4, w.group_size)
        assert tuple(layer.packed.shape) == (N, K // 2) and layer.biases is None
        assert layer.scales.dtype == (held if dtype == torch.bfloat16 else torch.float32)
        assert list(errors.worst) == []
        ids = torch.tensor([0, 33, 71])
        np.testing.assert_allclose(layer.rows(ids.to(device)).cpu().numpy(), w.dequantize()[ids.numpy()], rtol=1e-6)
    # float32: GEMV and GEMM (the interpreter runs no bf16 tl.dot); bf16 x: the GEMV
    for m, dtype in ((1, torch.float32), (37, torch.float32), (1, torch.bfloat16)):
        layer = ql.quantized_linear(w, torch.ones(N), device, dtype, ErrorLog(), kernel="triton")
        x = inputs(m, K, dtype).to(device)
        y = layer(x)
        assert y.dtype == dtype
        bound = F32 if dtype == torch.float32 else BF16
        assert rel(y.cpu(), reference(x.cpu(), w.dequantize(), torch.ones(N))) < bound


def test_only_fp4_values_are_taken_as_e2m1() -> None:
    """e2m1_codes recognises the fp4 forms and nothing else: a 5-bit weight whose levels are not all
    twice an e2m1 value (here one code 12 + 5), or whose biases are not one offset of steps, stays affine."""
    from lantern.app.models.quant.microscaled import e2m1_codes

    w = fp4_weight("mxfp4", 1.0)
    codes, scales = e2m1_codes(w)
    np.testing.assert_array_equal(scales, 2 * w.scales)
    assert codes.max() < 16 and not np.any(codes == 8)  # a zero is +0
    odd = w.codes.copy()
    odd[3, 5] = 17  # level 5: no e2m1 value is 2.5
    assert e2m1_codes(AffineWeight(odd, w.scales, w.biases, 5, 32, "t")) is None
    shifted = w.biases.copy()
    shifted[2, 1] *= 1.5
    assert e2m1_codes(AffineWeight(w.codes, w.scales, shifted, 5, 32, "t")) is None
    assert e2m1_codes(affine(N, K, 5, 32)) is None
    assert e2m1_codes(affine(N, K, 4, 32)) is None


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_path_bf16_scales_are_logged(triton_device: str) -> None:
    w = affine(N, K, 4, 32, seed=3)
    errors = ErrorLog()
    device = triton_device
    layer = ql.quantized_linear(w, None, device, torch.bfloat16, errors, kernel="triton")
    assert list(errors.worst) == [(w.source, "4-bit g32 (bfloat16 scales)")]
    x = inputs(1, K, torch.float32).to(device)  # M = 1: the GEMV (bf16 tl.dot is wrong in the interpreter)
    y = layer(x)
    assert y.dtype == torch.float32
    assert rel(y.cpu(), reference(x.cpu(), w.dequantize())) < BF16


@pytest.mark.parametrize("bits", [pytest.param(4, marks=needs_int4pack), 8])
def test_prefill_rows_take_the_dense_path_with_the_stored_weight(bits: int, monkeypatch) -> None:
    """At DENSE_ROWS rows and more the packed CPU layers decode their weight (in chunks of rows:
    a small DENSE_CHUNK forces several, the last one partly padding) and run one float GEMM. The
    result is the stored weight's exact product in float32, and agrees with the packed kernel."""
    n, k = 200, K  # 200 rows: int4pack's last 64-row block is partly padding
    src = affine(n, k, bits, 32 if bits == 4 else k, seed=21)
    if bits == 8:  # per-channel symmetric: what Int8PackLinear holds exactly
        src = quantize_affine(src.dequantize(), 8, k, symmetric=True, source="sym 8")
    layer = ql.quantized_linear(src, None, "cpu", torch.float32, ErrorLog())
    assert isinstance(layer, ql.Int4PackLinear if bits == 4 else ql.Int8PackLinear)
    held = layer.rows(torch.arange(n)).double()  # what the layer stores, decoded row by row
    monkeypatch.setattr(packed_decode, "DENSE_CHUNK", 64 * k)  # 64 rows per chunk: 4 chunks
    x = inputs(packed_decode.DENSE_ROWS + 3, k, torch.float32)
    calls = []
    dense = ql.dense_matmul
    monkeypatch.setattr(ql, "dense_matmul", lambda x, *a: calls.append(x.shape[0]) or dense(x, *a))
    y = layer(x)
    assert y.shape == (x.shape[0], n) and y.dtype == torch.float32
    assert rel(y, x.double() @ held.T) < F32  # float32 GEMM on the exact stored values
    small = layer(x[:5])  # below the threshold: the packed kernel (x rounded to bf16)
    assert rel(small, x[:5].double() @ held.T) < BF16
    assert rel(y[:5], small.double()) < BF16
    assert calls == [x.shape[0]]  # the 5-row call stayed on the packed kernel
    bf = layer(x.bfloat16())
    assert bf.dtype == torch.bfloat16 and rel(bf, x.bfloat16().double() @ held.T) < BF16


def test_fp8_parts_stack_along_rows() -> None:
    """concat_fp8_rows: per-tensor and per-channel parts become one per-channel weight; block-scaled
    parts stack when every part but the last fills whole row blocks; the values are the parts' values."""
    from lantern.app.models.quant.affine import concat_fp8_rows

    a = fp8(64, 128, np.array(0.5), None, "a")
    b = fp8(32, 128, np.random.default_rng(9).uniform(0.1, 1, (32, 1)), None, "b")
    joined = concat_fp8_rows([a, b])
    assert joined.scale.shape == (96, 1) and joined.block is None
    np.testing.assert_array_equal(joined.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))
    g = fp8(128, 256, np.ones((1, 2)), (128, 128), "g")
    u = fp8(64, 256, np.full((1, 2), 2.0), (128, 128), "u")  # the last part may end in a partial block
    joined = concat_fp8_rows([g, u])
    assert joined.block == (128, 128) and joined.scale.shape == (2, 2)
    np.testing.assert_array_equal(joined.dequantize(), np.concatenate([g.dequantize(), u.dequantize()]))
    assert concat_fp8_rows([u, g]) is None  # a partial block row inside the stack
    assert concat_fp8_rows([g, fp8(64, 256, np.array(0.5), None, "t")]) is None  # block and per-tensor scales
    assert concat_fp8_rows([a, g]) is None  # different widths


def test_fp8_expert_projections_join_and_take_triton_on_cuda(monkeypatch) -> None:
    """The torch loader joins an expert's gate and up FP8 weights into one layer and, on CUDA, asks for
    the Triton kernel, so that the layer's experts stack for the fused MoE kernel (a per-channel FP8
    expert would otherwise take torch._scaled_mm, which does not stack); other projections keep
    select_kernel's choice."""
    from lantern.backends.torch import weights

    calls = []

    def record(w, bias, device, dtype, errors, kernel=None):
        calls.append((w, kernel))
        return "layer"

    monkeypatch.setattr(ql, "quantized_linear", record)
    loader = weights._Loader.__new__(weights._Loader)
    loader.device, loader.dtype, loader.errors = torch.device("cuda"), torch.bfloat16, ErrorLog()
    gate = fp8(128, 256, np.random.default_rng(1).uniform(0.1, 1, (128, 1)), None, "gate")
    up = fp8(128, 256, np.array(0.25), None, "up")
    assert loader.quantized_layer("model.layers.0.mlp.experts.3.gate_up_proj", [gate, up], expert=True) == "layer"
    ((w, kernel),) = calls
    assert kernel == "triton" and w.shape == (256, 256) and w.scale.shape == (256, 1)
    np.testing.assert_array_equal(w.dequantize(), np.concatenate([gate.dequantize(), up.dequantize()]))
    loader.quantized_layer("model.layers.0.mlp.gate_up_proj", [gate, up])
    assert calls[-1][1] is None
    loader.device = torch.device("cpu")
    loader.quantized_layer("model.layers.0.mlp.experts.3.down_proj", [gate], expert=True)
    assert calls[-1][1] is None


def test_tensor_parallel_pads_fp8_rows() -> None:
    """A vocabulary that does not divide by the ranks pads its FP8 rows (zero bytes, unit scales)."""
    from lantern.backends.torch.weights import _pad_rows

    per_channel = fp8(33, 64, np.random.default_rng(2).uniform(0.1, 1, (33, 1)), None, "pc")
    for w in (per_channel, fp8(33, 64, np.array(0.5), None, "pt"), fp8(33, 64, np.ones((2, 2)), (32, 32), "blk")):
        padded = _pad_rows(w, 40)
        assert padded.shape == (40, 64)
        np.testing.assert_array_equal(padded.dequantize()[:33], w.dequantize())
        assert not padded.dequantize()[33:].any()


def test_fp8_as_affine_in_chunks_equals_one_pass() -> None:
    """fp8_as_affine works through ~1 MB of rows at a time, whole scale blocks each: on a weight of
    several chunks with a partial last block row, the codes and scales equal one quantize_affine of the
    whole dequantized weight, and the error is that weight's."""
    from lantern.app.models.quant.affine import fp8_as_affine, quantize_affine

    w = fp8(300, 8192, np.random.default_rng(3).uniform(0.005, 0.02, (3, 64)), (128, 128), "big")
    held, error = fp8_as_affine(w, 8, 32)
    whole = quantize_affine(w.dequantize(), 8, 32)
    np.testing.assert_array_equal(held.codes, whole.codes)
    np.testing.assert_array_equal(held.scales, whole.scales)
    np.testing.assert_array_equal(held.biases, whole.biases)
    exact = w.dequantize()
    diff, exact = (whole.dequantize() - exact).astype(np.float64), exact.astype(np.float64)
    assert error == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(exact), rel=1e-6)
