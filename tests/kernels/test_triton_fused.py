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
