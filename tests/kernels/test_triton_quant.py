"""Quantized matmul kernels (triton_quant) against their plain-torch reference, and the layout against MLX.

On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, see conftest.py) with small block
overrides so that grids stay tiny; K = 3 groups leaves a half-masked last K step for both kernels.
The cuda cases (marked gpu) use the block sizes affine_matmul picks, and bfloat16 too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.backends.torch.kernels import quant_reference as qr

tq = pytest.importorskip("lantern.backends.torch.kernels.triton_quant")

CPU_DTYPES = [torch.float32, torch.float16]  # the interpreter cannot run bf16 tl.dot
TOL = {
    torch.float32: 1e-5,
    torch.float16: 2e-3,  # the GEMM rounds dequantized weights to f16, as a GPU tensor-core dot needs
    torch.bfloat16: 1.6e-2,
}
SMALL = {  # block sizes for the interpreter; BLOCK_K = 64 covers GS = 2 (g32), 1 (g64) and 1/2 (g128)
    "gemv": lambda g: {"BLOCK_N": 8, "BLOCK_K": 2 * g, "rows_per_pass": 3},
    "gemm": lambda g: {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64},
}


def make_weight(n: int, k: int, bits: int, group: int, dtype: torch.dtype, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.uint8)
    # Scales of both signs and biases around -scale * 2^(bits-1), as quantizers produce.
    sign = torch.sign(torch.randn(n, k // group, generator=g))
    scales = (torch.rand(n, k // group, generator=g) * 0.04 + 0.01) * sign
    biases = -scales * 2 ** (bits - 1) + 0.01 * torch.randn(n, k // group, generator=g)
    packed = tq.pack_codes(codes, bits)
    return codes, packed.to(device), scales.to(device, dtype), biases.to(device, dtype)


def run(path: str, x, packed, scales, biases, bits: int, group: int, **config):
    return (tq.gemv if path == "gemv" else tq.gemm)(x, packed, scales, biases, bits, group, **config)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = float(ref.float().abs().max()) + 1e-6
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype] * scale, rtol=TOL[dtype])


@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_matches_reference(bits, group, dtype, path):
    k = 3 * group
    for m, n in [(1, 40), (3, 72), (17, 40)]:  # GEMV: 1 pass, 1 pass with a padded row, 6 passes
        _, packed, scales, biases = make_weight(n, k, bits, group, dtype, seed=m * n + group)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        out = run(path, x, packed, scales, biases, bits, group, **SMALL[path](group))
        assert_matches(out, qr.affine_matmul_reference(x, packed, scales, biases, bits, group), dtype)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_nibble_order_by_hand(path):
    """Byte j = code[2j] | code[2j+1] << 4: a one-hot x picks one known weight out of each row."""
    codes = torch.zeros(2, 32, dtype=torch.uint8)
    codes[0, 1] = 15  # odd column: the high nibble of byte 0
    codes[1, 0] = 7  # even column: the low nibble of byte 0
    packed = tq.pack_codes(codes, 4)
    assert packed[0, 0] == 0xF0 and packed[1, 0] == 0x07
    scales = torch.tensor([[0.5], [2.0]])
    biases = torch.tensor([[-1.0], [0.25]])
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 10.0, 1.0
    # row 0: 10 * (0 * 0.5 - 1) + (15 * 0.5 - 1) = -3.5; row 1: 10 * (7 * 2 + 0.25) + (0 * 2 + 0.25) = 142.75
    out = run(path, x, packed, scales, biases, 4, 32, **SMALL[path](32))
    assert out.tolist() == [[-3.5, 142.75]]
    assert qr.affine_matmul_reference(x, packed, scales, biases, 4, 32).tolist() == [[-3.5, 142.75]]


def test_pack_codes_round_trip_and_layout():
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = tq.pack_codes(codes, 4)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(qr.unpack_codes(packed, 4), codes)
    assert tq.pack_codes(torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8), 4).tolist() == [[0x21, 0x43]]
    codes8 = torch.randint(0, 256, (3, 64), dtype=torch.uint8)
    assert torch.equal(qr.unpack_codes(tq.pack_codes(codes8, 8), 8), codes8)
    with pytest.raises(ValueError, match="< 16"):
        tq.pack_codes(codes8, 4)
    with pytest.raises(ValueError, match="even"):
        tq.pack_codes(codes[:, :3], 4)
    with pytest.raises(ValueError, match="4- or 8-bit"):
        tq.pack_codes(codes, 3)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 128])
def test_layout_is_mlx_packing(bits, group):
    """The packed bytes read as little-endian uint32 are mx.quantize's words: mx.dequantize is the truth."""
    mx = pytest.importorskip("mlx.core")
    w = np.random.default_rng(group + bits).standard_normal((24, 256)).astype(np.float32)
    wq, s, b = mx.quantize(mx.array(w), group_size=group, bits=bits)
    packed = torch.from_numpy(np.array(wq).view(np.uint8).copy())
    scales, biases = torch.from_numpy(np.array(s)), torch.from_numpy(np.array(b))
    truth = np.array(mx.dequantize(wq, s, b, group_size=group, bits=bits))
    np.testing.assert_allclose(qr.dequantize_packed(packed, scales, biases, bits, group).numpy(), truth, rtol=1e-6)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    mlx_out = np.array(mx.quantized_matmul(mx.array(x), wq, s, b, transpose=True, group_size=group, bits=bits))
    for path in ("gemv", "gemm"):
        out = run(path, torch.from_numpy(x), packed, scales, biases, bits, group, **SMALL[path](group))
        np.testing.assert_allclose(out.numpy(), mlx_out, rtol=1e-4, atol=1e-4 * np.abs(mlx_out).max())


@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("group", [16, 32, 64, 128])
def test_e2m1_kernel_matches_reference(group, dtype, path):
    """fp4 codes (every nibble is a valid e2m1 value) with scales of both signs, no biases."""
    k = 3 * group
    for m, n in [(1, 40), (3, 72), (17, 40)]:
        g = torch.Generator().manual_seed(m * n + group)
        packed = tq.pack_codes(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), 4)
        scales = ((torch.rand(n, k // group, generator=g) * 0.04 + 0.01) * torch.sign(torch.randn(n, 1))).to(dtype)
        x = torch.randn(m, k, generator=g).to(dtype)
        config = {**SMALL[path](group), "BLOCK_K": 64} if path == "gemm" and group == 128 else SMALL[path](group)
        out = run(path, x, packed, scales, None, 4, group, code="e2m1", **config)
        assert_matches(out, qr.e2m1_matmul_reference(x, packed, scales, group), dtype)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_e2m1_values_by_hand(path):
    """Row r holds code r in column r (and 0 elsewhere); x = the identity picks w[r, r] = value(r) * scale:
    0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0), exponent 0 being e2m1's subnormals."""
    codes = torch.diag(torch.arange(16, dtype=torch.uint8))
    codes = torch.cat((codes, torch.zeros(16, 16, dtype=torch.uint8)), dim=1)  # 32 columns: two g16 groups
    scales = torch.full((16, 2), 0.25)
    scales[:, 0] = torch.tensor([2.0**e for e in range(-8, 8)])  # scales across the float16 range too
    out = run(path, torch.eye(16, 32), tq.pack_codes(codes, 4), scales, None, 4, 16, code="e2m1", **SMALL[path](16))
    expected = torch.tensor(qr.E2M1_VALUES) * scales[:, 0]
    assert torch.equal(out.diagonal(), expected)
    assert torch.count_nonzero(out - torch.diag(expected)) == 0


@pytest.mark.parametrize("mode,group", [("mxfp4", 32), ("nvfp4", 16)])
def test_e2m1_layout_is_mlx_fp4(mode, group):
    """MLX's own fp4 modes: mx.quantize(mode=...)'s words are the packed nibbles, its e8m0 / e4m3 scale
    bytes give the scales; mx.dequantize and mx.quantized_matmul are the truth."""
    mx = pytest.importorskip("mlx.core")
    from lantern.app.models.quant.affine import E4M3_VALUES

    w = np.random.default_rng(group).standard_normal((24, 256)).astype(np.float32)
    wq, s = mx.quantize(mx.array(w), group_size=group, bits=4, mode=mode)[:2]
    packed = torch.from_numpy(np.array(wq).view(np.uint8).copy())
    raw = np.array(s).view(np.uint8)
    scale = E4M3_VALUES[raw] if mode == "nvfp4" else np.exp2(raw.astype(np.float32) - 127)
    scales = torch.from_numpy(np.ascontiguousarray(scale, np.float32))
    truth = np.array(mx.dequantize(wq, s, None, group_size=group, bits=4, mode=mode).astype(mx.float32))
    np.testing.assert_array_equal(qr.dequantize_e2m1(packed, scales, group).numpy(), truth)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    mlx_out = mx.quantized_matmul(mx.array(x), wq, s, None, transpose=True, group_size=group, bits=4, mode=mode)
    mlx_out = np.array(mlx_out.astype(mx.float32))
    for path in ("gemv", "gemm"):
        out = run(path, torch.from_numpy(x), packed, scales, None, 4, group, code="e2m1", **SMALL[path](group))
        np.testing.assert_allclose(out.numpy(), mlx_out, rtol=1e-4, atol=1e-4 * np.abs(mlx_out).max())


def e4m3_weight(n: int, k: int, group: int, dtype: torch.dtype, seed: int):
    """FP8 bytes (torch's e4m3fn cast of random values, with zero, -0, subnormals and the largest
    normal planted in row 0) and scales of both signs."""
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(n, k, generator=g) * 40).to(torch.float8_e4m3fn).view(torch.uint8)
    codes[0, :8] = torch.tensor([0x00, 0x01, 0x06, 0x08, 0x80, 0x83, 0x7E, 0xFE], dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=g) * 0.004 + 0.001) * torch.sign(torch.randn(n, 1, generator=g))
    return codes, scales.to(dtype)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_e4m3_kernel_matches_reference(group, dtype, path):
    """FP8 bytes (block-scaled checkpoints) against torch's own float8_e4m3fn decode times the scales."""
    k = 3 * group
    for m, n in [(1, 40), (3, 72), (17, 40)]:
        packed, scales = e4m3_weight(n, k, group, dtype, seed=m * n + group)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        out = run(path, x, packed, scales, None, 8, group, code="e4m3", **SMALL[path](group))
        ref = (x.float() @ qr.dequantize_e4m3(packed, scales, group).T).to(dtype)
        assert_matches(out, ref, dtype)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_e4m3_every_code_by_hand(path):
    """Every non-NaN e4m3fn byte through the kernel: x = the identity picks w[n, k] = value * scale,
    which must equal torch's decode exactly (subnormals, -0 and 448 included)."""
    codes = torch.arange(256, dtype=torch.uint8).view(2, 128)
    codes[0, 0x7F], codes[1, 0x7F] = 0, 0x80  # the NaN codes 0x7F and 0xFF: FP8 weights hold none
    scales = torch.tensor([[0.25], [2.0]])
    out = run(path, torch.eye(128), codes, scales, None, 8, 128, code="e4m3", **SMALL[path](128))
    expected = codes.view(torch.float8_e4m3fn).float() * scales
    assert torch.equal(out.T, expected)


def test_affine_matmul_dispatch_and_default_blocks(monkeypatch):
    """M <= GEMV_MAX_M takes the float GEMV (float32 x: the dp4a one takes 16-bit x, see
    test_triton_gemv_dp4a), more rows the GEMM; leading dims are kept; default block sizes work."""
    _, packed, scales, biases = make_weight(40, 256, 4, 64, torch.float32, seed=3)
    calls = []
    for name in ("gemv", "gemm"):
        fn = getattr(tq, name)
        monkeypatch.setattr(tq, name, lambda *a, _fn=fn, _name=name, **kw: calls.append(_name) or _fn(*a, **kw))
    for m in (1, tq.GEMV_MAX_M, tq.GEMV_MAX_M + 1, 5):
        x = torch.randn(m, 256)
        out = tq.affine_matmul(x, packed, scales, biases, 4, 64)
        assert_matches(out, qr.affine_matmul_reference(x, packed, scales, biases, 4, 64), torch.float32)
    assert calls == ["gemv", "gemv", "gemm", "gemm"]
    x3 = torch.randn(2, 3, 256)
    out3 = tq.affine_matmul(x3, packed, scales.float(), biases.float(), 4, 64)
    assert out3.shape == (2, 3, 40)
    ref = qr.affine_matmul_reference(x3.reshape(6, 256), packed, scales.float(), biases.float(), 4, 64)
    assert_matches(out3.reshape(6, 40), ref, torch.float32)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_strided_and_empty_inputs(path):
    _, packed, scales, biases = make_weight(24, 128, 8, 32, torch.float32, seed=5)
    wide = torch.randn(3, 160)
    for x in (wide[:, 16:144], torch.randn(128, 3).T):  # a column slice (row stride 160); a transpose
        out = run(path, x, packed, scales, biases, 8, 32, **SMALL[path](32))
        assert_matches(out, qr.affine_matmul_reference(x, packed, scales, biases, 8, 32), torch.float32)
    assert run(path, torch.zeros(0, 128), packed, scales, biases, 8, 32).shape == (0, 24)


def test_shape_errors():
    _, packed, scales, biases = make_weight(8, 64, 4, 32, torch.float32)
    x = torch.randn(1, 64)
    with pytest.raises(ValueError, match="does not hold"):
        tq.affine_matmul(torch.randn(1, 128), packed, scales, biases, 4, 32)
    with pytest.raises(ValueError, match="do not fit"):
        tq.affine_matmul(x, packed, scales[:, :1], biases[:, :1], 4, 32)
    with pytest.raises(ValueError, match="group size"):
        tq.affine_matmul(x, packed, scales, biases, 4, 16)
    with pytest.raises(ValueError, match="e2m1 weights are 4-bit"):
        tq.float_matmul(x, packed, scales, 8, "e2m1")
    with pytest.raises(ValueError, match="do not fit"):
        tq.float_matmul(x, packed, scales, 16, "e2m1")  # 4 groups of 16 need 4 scales a row
    with pytest.raises(ValueError, match="e4m3 codes are 8-bit"):
        tq.gemv(x, packed, scales, None, 4, 32, code="e4m3")
    with pytest.raises(ValueError, match="affine weights take biases"):
        tq.gemv(x, packed, scales, None, 4, 32, code="affine")
    with pytest.raises(ValueError, match="do not match"):
        qr.dequantize_packed(packed, scales[:, :1], biases[:, :1], 4, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (4, 128), (8, 32), (8, 128)])
@pytest.mark.parametrize("m", [1, 2, 3, 16, 40, 300])
def test_cuda_default_blocks(m, bits, group, dtype):
    """On a GPU, with the block sizes affine_matmul picks, at 8B-model-like widths (and a narrow one)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for n, k in [(4096, 4096), (1024, 4096), (4100, 1536)]:
        _, packed, scales, biases = make_weight(n, k, bits, group, dtype, seed=m + n, device="cuda")
        x = torch.randn(m, k, device="cuda").to(dtype)
        out = tq.affine_matmul(x, packed, scales, biases, bits, group)
        ref = qr.affine_matmul_reference(x, packed, scales, biases, bits, group)
        if m <= tq.GEMV_MAX_M and tq.triton_gemv_dp4a.enabled(x, bits, group):  # int8 activations
            int8_ref = qr.int8_activation_matmul_reference(x, packed, scales, biases, bits, group)
            assert_matches(out, int8_ref, dtype)
        else:
            assert_matches(out, ref, dtype)
        for path in ("gemv", "gemm"):  # both float kernels at every M, not only the one dispatch picks
            assert_matches(run(path, x, packed, scales, biases, bits, group), ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("m", [1, 2, 3, 40, 300])
def test_cuda_e2m1_default_blocks(m, group, dtype):
    """fp4 (NVFP4's g16, MXFP4's g32) on a GPU with the default block sizes, both kernels."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    g = torch.Generator().manual_seed(m + group)
    for n, k in [(4096, 4096), (4100, 1536)]:
        packed = tq.pack_codes(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), 4).cuda()
        scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).to("cuda", dtype)
        x = torch.randn(m, k, device="cuda").to(dtype)
        ref = qr.e2m1_matmul_reference(x, packed, scales, group)
        assert_matches(tq.float_matmul(x, packed, scales, group, "e2m1"), ref, dtype)
        for path in ("gemv", "gemm"):
            assert_matches(run(path, x, packed, scales, None, 4, group, code="e2m1"), ref, dtype)


def test_the_gemv_sweep_script_runs_and_checks_its_kernel_first(tmp_path, capsys, monkeypatch):
    """scripts/bench_qgemv.py (the next GPU session's block-size sweep) on a tiny shape in the
    interpreter: the default config is checked against the reference, every timed config comes from
    its grid, and the summary names the best one; a kernel off the reference stops the run."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_qgemv.py"
    spec = importlib.util.spec_from_file_location("bench_qgemv", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--device", "cpu", "--shape", "32x256", "--dtype", "float32", "--iters", "1", "--repeats", "1"]
    summary = script.main([*args, "--max-configs", "2", "--json", str(tmp_path / "q.json")])
    (shape,) = summary["shapes"]
    assert shape["shape"] == "32x256" and shape["max_rel_err"] < 1e-5
    assert shape["best"]["config"] in script.configs(32, 256, 64)[:2]
    assert json.loads((tmp_path / "q.json").read_text())["shapes"][0]["best"] == shape["best"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["32x256"]["best"]["config"] == shape["best"]["config"]
    # --stages narrows the grid; the JSON, named by LANTERN_GEMV_CONFIGS, sets the GEMV's blocks for that
    # shape (bits, group and code kind too) and nowhere else
    assert all(c["num_stages"] == 1 for c in script.configs(32, 256, 64, (1,)))
    script.main([*args, "--max-configs", "3", "--stages", "1", "--json", str(tmp_path / "q.json")])
    sweep = json.loads((tmp_path / "q.json").read_text())
    best = {"BLOCK_N": 4, "BLOCK_K": 128, "num_warps": 8, "num_stages": 1}  # a winner unlike the built-in one
    sweep["shapes"][0]["best"]["config"] = best
    (tmp_path / "q.json").write_text(json.dumps(sweep))
    built_in = tq._gemv_config(32, 256, 4, 64)
    others = {key: tq._gemv_config(*key) for key in ((32, 512, 4, 64), (32, 256, 4, 32), (32, 256, 4, 64, True))}
    monkeypatch.setenv("LANTERN_GEMV_CONFIGS", str(tmp_path / "q.json"))
    tq._swept_configs.cache_clear()
    try:
        assert tq._gemv_config(32, 256, 4, 64) == best
        assert {key: tq._gemv_config(*key) for key in others} == others  # another K, group or fp4: built in
        _, packed, scales, biases = make_weight(32, 256, 4, 64, torch.float32, seed=7)
        x = torch.randn(1, 256)
        ref = qr.affine_matmul_reference(x, packed, scales, biases, 4, 64)
        assert_matches(tq.gemv(x, packed, scales, biases, 4, 64), ref, torch.float32)
        monkeypatch.setenv("LANTERN_GEMV_CONFIGS", str(tmp_path / "missing.json"))
        tq._swept_configs.cache_clear()
        assert tq._gemv_config(32, 256, 4, 64) == built_in  # unreadable: warned, built-in configs
    finally:
        tq._swept_configs.cache_clear()
    monkeypatch.setattr(tq, "gemv", lambda *a, **k: torch.zeros(1, 32))  # a kernel gone wrong
    with pytest.raises(SystemExit, match="off the reference"):
        script.main([*args, "--max-configs", "1"])
