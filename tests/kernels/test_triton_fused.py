"""The fused elementwise kernels (RMSNorm + residual add, rotary) against their torch references.

On CPU they run in Triton's interpreter (see conftest.py); the cuda cases are marked gpu and also
cover bfloat16, which the interpreter cannot represent (numpy has no bfloat16).
"""

from __future__ import annotations

import pytest
import torch

from lantern.backends.torch.kernels import reference

triton_fused = pytest.importorskip("lantern.backends.torch.kernels.triton_fused")

CASES = [("cpu", torch.float32), ("cpu", torch.float16)] + [
    pytest.param("cuda", dt, marks=pytest.mark.gpu) for dt in (torch.float32, torch.float16, torch.bfloat16)
]
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def device_ok(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("cols", [64, 576, 128])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(device, dtype, cols, with_residual):
    device_ok(device)
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(7, cols, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(device, dtype)
    res = torch.randn(7, cols, generator=g).to(device, dtype) if with_residual else None
    out, new_res = triton_fused.rms_norm(x, w, 1e-5, res)
    ref_out, ref_res = reference.rms_norm(x, w, 1e-5, res)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    assert torch.equal(new_res, ref_res)  # the residual sum is rounded the same way, exactly
    assert out.dtype == dtype and out.shape == x.shape


@pytest.mark.parametrize("device,dtype", CASES[:2] + CASES[3:])
def test_rms_norm_per_head_3d(device, dtype):
    """The q/k norms of Qwen3 normalise each head of a [T, H, D] tensor."""
    device_ok(device)
    x = torch.randn(4, 6, 64).to(device, dtype)
    w = torch.rand(64).to(device, dtype)
    torch.testing.assert_close(triton_fused.rms_norm(x, w, 1e-6)[0], reference.rms_norm(x, w, 1e-6)[0], **TOL[dtype])


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("heads,d", [(4, 64), (2, 128), (3, 96)])
def test_rotary(device, dtype, heads, d):
    device_ok(device)
    t = 9
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(100).float(), inv)
    emb = torch.cat([freqs, freqs], -1)
    pos = torch.tensor([0, 1, 5, 17, 42, 43, 44, 98, 99])
    cos, sin = emb.cos()[pos].to(device), emb.sin()[pos].to(device)
    x = torch.randn(t, heads, d).to(device, dtype)
    ours = triton_fused.rotary(x, cos, sin)
    torch.testing.assert_close(ours, reference.rotary(x, cos, sin), **TOL[dtype])
    # A strided view (q sliced out of a fused projection) is read correctly.
    wide = torch.randn(t, heads + 2, d).to(device, dtype)
    torch.testing.assert_close(
        triton_fused.rotary(wide[:, 1:-1], cos, sin), reference.rotary(wide[:, 1:-1], cos, sin), **TOL[dtype]
    )


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("heads,kvh,d", [(4, 2, 64), (8, 1, 128), (3, 3, 96)])
def test_rotary_write_kv(device, dtype, heads, kvh, d):
    """rotary_write_kv on q's and k's heads sliced out of a fused qkv projection (strided views, as
    layers.Attention passes them): the rotated heads as rotary gives them, and the pools as write_kv leaves them
    after that rotary -- rotated k and v rows at each token's slot, none where the slot is -1, nothing else
    touched; a pool of another dtype takes the rows cast as write_kv casts them."""
    device_ok(device)
    t = 5
    g = torch.Generator().manual_seed(heads * d)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([torch.outer(torch.arange(64).float(), inv)] * 2, -1)
    pos = torch.tensor([3, 0, 17, 63, 8])
    cos, sin = emb.cos()[pos].to(device), emb.sin()[pos].to(device)
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=g).to(device, dtype)
    qk = qkv[:, : (heads + kvh) * d].view(t, heads + kvh, d)
    v = qkv[:, (heads + kvh) * d :].view(t, kvh, d)
    slots = torch.tensor([9, -1, 0, 30, 4], device=device)
    for pool_dtype in (dtype, torch.float16):
        k_pool = torch.randn(32, kvh, d, generator=g).to(device, pool_dtype)
        v_pool = torch.randn(32, kvh, d, generator=g).to(device, pool_dtype)
        ref_k, ref_v = k_pool.clone(), v_pool.clone()
        out = triton_fused.rotary_write_kv(qk, v, cos, sin, k_pool, v_pool, slots)
        want = reference.rotary(qk, cos, sin)
        torch.testing.assert_close(out, want, **TOL[dtype])
        assert torch.equal(out, triton_fused.rotary(qk, cos, sin))  # the rotary kernel's values, exactly
        reference.write_kv(ref_k, ref_v, out[:, heads:], v, slots)
        assert torch.equal(k_pool, ref_k) and torch.equal(v_pool, ref_v)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("bits,group,k", [(4, 32, 96), (4, 64, 4096), (8, 128, 256)])
def test_affine_rows_are_the_layers_rows(device, dtype, bits, group, k):
    """A quantized embedding's lookup in one kernel == TritonLinear.rows (the torch ops) cast to the dtype, exactly:
    repeated and out-of-order ids, 4-bit nibbles in both halves of a byte, every group."""
    device_ok(device)
    from lantern.backends.torch.kernels import triton_quant

    g = torch.Generator().manual_seed(bits * k)
    n = 50
    codes = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    packed = triton_quant.pack_codes(codes, bits).to(device)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).to(device, dtype)
    biases = (-8 * scales.float() + 0.01 * torch.randn(n, k // group, generator=g).to(device)).to(dtype)
    ids = torch.tensor([7, 0, 49, 7, 13], device=device)
    got = triton_fused.affine_rows(packed, scales, biases, bits, group, ids, dtype)
    rows = codes[ids.cpu()].float().view(len(ids), -1, group) * scales[ids].float().cpu()[:, :, None]
    want = (rows + biases[ids].float().cpu()[:, :, None]).view(len(ids), k).to(dtype)
    assert got.shape == (len(ids), k) and got.dtype == dtype
    assert torch.equal(got.cpu(), want)
