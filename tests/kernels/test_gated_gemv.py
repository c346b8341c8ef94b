"""A gated MLP's decode step in fewer kernels: SiLU(gate) * up made in the gate_up GEMV's epilogue (dp4a), and
one Triton SiLU * up kernel where the GEMV does not make it (prefill, float weights).

References: the int8-activation GEMV reference (quant_reference) with torch's F.silu applied in float32, and the
MLP's own unfused path (gate_up, then F.silu(gate) * up). On CPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the CUDA path runs on CPU

import types

import numpy as np
import pytest
import torch.nn.functional as F

from lantern.backends.torch.kernels import quant_reference as qr

td = pytest.importorskip("lantern.backends.torch.kernels.triton_gemv_dp4a")
tf = pytest.importorskip("lantern.backends.torch.kernels.triton_fused")

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # the output's rounding, relative to its largest value
SMALL = {"BLOCK_N": 8, "NB": 4, "num_warps": 1}  # 128 columns a step: 3 groups of 64 leave a masked step


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def gated_reference(x, packed, scales, biases, bits, group) -> torch.Tensor:
    """silu(gate) * up in float32 of the int8-activation GEMV's sums (gate: the first half of the rows)."""
    h = qr.affine_matmul_reference(qr.int8_activations(x), packed, scales, biases, bits, group)
    gate, up = h.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def make_weight(n, k, bits, group, dtype, seed):
    from tests.kernels.test_triton_quant import make_weight as codes_and_weight

    return codes_and_weight(n, k, bits, group, dtype, seed, "cpu")[1:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64), (4, 128)])
def test_the_epilogue_makes_silu_of_gate_times_up(bits, group, dtype):
    """gated=True on a [gate; up] weight: out [M, N / 2] = silu(gate) * up, each gate row paired with its up row
    (a swap, or a pairing off by a row, is far outside the bound), 1 to 3 rows of x (an odd M: the last pair's
    second row unstored), masked K and ragged columns (the last program's pairs partly masked)."""
    cases = [(1, 20, 3 * group, SMALL), (3, 13, 384, SMALL), (2, 24, 256, {}), (1, 37, 512, {})]
    for m, inner, k, cfg in cases:
        packed, scales, biases = make_weight(2 * inner, k, bits, group, dtype, seed=m * inner + bits)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)).to(dtype)
        out = td.gemv(x, packed, scales, biases, bits, group, gated=True, **cfg)
        assert out.shape == (m, inner) and out.dtype == dtype
        want = gated_reference(x, packed, scales, biases, bits, group)
        assert rel_err(out, want) < TOL[dtype], (m, inner, k, cfg)
        h = qr.affine_matmul_reference(qr.int8_activations(x), packed, scales, biases, bits, group).float()
        gate, up = h.chunk(2, dim=-1)
        assert rel_err(out, F.silu(up) * gate) > 0.1  # the halves are not interchangeable: the order is checked
    packed, scales, biases = make_weight(7, 64, 4, 32, torch.float16, seed=1)
    with pytest.raises(ValueError, match="N even"):
        td.gemv(torch.randn(1, 64).half(), packed, scales, biases, 4, 32, gated=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2 * 4096), (5, 2 * 1000), (2, 3, 2 * 64)])
def test_the_silu_mul_kernel_rounds_as_torch_does(shape, dtype):
    """triton_fused.silu_mul (the CUDA path of ops.silu_mul): F.silu(gate) * up with the same roundings (silu's
    output in x's dtype, then the product), any leading dims, an inner width over one block and a ragged one."""
    gu = (3 * torch.randn(*shape, generator=torch.Generator().manual_seed(shape[-1]))).to(dtype)
    gate, up = gu.chunk(2, dim=-1)
    want = F.silu(gate.float()).to(dtype) * up
    got = tf.silu_mul(gu)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-3 if dtype == torch.float16 else 1e-6)
    strided = torch.cat([gu, gu], dim=-1)[..., : shape[-1]]  # rows a stride apart wider than their width
    torch.testing.assert_close(tf.silu_mul(strided), got, atol=0, rtol=0)


def quantized_mlp(dtype: torch.dtype, hidden: int = 256, inner: int = 96):
    """layers.MLP (silu) whose gate_up is the CUDA quantized layer (TritonLinear, 4-bit g32; on CPU under the
    interpreter) and whose down is a float nn.Linear."""
    from lantern.app.models.quant.affine import AffineWeight, ErrorLog
    from lantern.backends.torch import layers
    from lantern.backends.torch import quant_linear as ql

    cfg = types.SimpleNamespace(intermediate_size=inner, hidden_act="silu", hidden_size=hidden, sub_norms=False)
    mlp = layers.MLP(cfg, types.SimpleNamespace(all_reduce=lambda t: t)).to(dtype)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (2 * inner, hidden), dtype=np.uint8)
    scales = rng.uniform(0.02, 0.05, (2 * inner, hidden // 32)).astype(np.float32)
    w = AffineWeight(codes, scales, (-8 * scales).astype(np.float32), 4, 32, "gate_up")
    mlp.gate_up_proj = ql.quantized_linear(w, None, "cpu", dtype, ErrorLog(), kernel="triton")
    return mlp


@pytest.mark.parametrize("rows", [1, 2, 3])
@torch.inference_mode()
def test_a_quantized_mlp_decode_step_takes_the_gated_gemv(rows, monkeypatch):
    """MLP.forward: a decode step of <= 2 rows on a TritonLinear gate_up takes one gated dp4a GEMV (no gate_up
    tensor, no separate activation); 3 rows, or LANTERN_GEMV=float, take gate_up then the activation. Both
    paths give the same output within fp16's rounding of the intermediate values."""
    mlp = quantized_mlp(torch.float16)
    calls = []
    spy = td.gemv
    monkeypatch.setattr(td, "gemv", lambda *a, **kw: calls.append(kw.get("gated", False)) or spy(*a, **kw))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).half()
    out = mlp(x)
    assert calls == ([True] if rows <= 2 else [])  # (3 rows: the GEMM)
    layer = mlp.gate_up_proj
    h = qr.affine_matmul_reference(
        qr.int8_activations(x) if rows <= 2 else x.float(), layer.packed, layer.scales, layer.biases, 4, 32
    )
    gate, up = h.float().chunk(2, dim=-1)
    want = F.linear(F.silu(gate) * up, mlp.down_proj.weight.float())  # (all in float32)
    assert rel_err(out, want) < 4e-3
    calls.clear()
    monkeypatch.setenv("LANTERN_GEMV", "float")
    td.mode.cache_clear()
    try:
        assert layer.silu_mul(x) is None
        unfused = mlp(x)
        assert calls == []
        assert rel_err(unfused, out) < 4e-3
    finally:
        td.mode.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
@pytest.mark.parametrize("m", [1, 2])
def test_cuda_gated_epilogue(m, bits, group, dtype):
    """On a GPU (inline PTX dp4a, the configs gemv picks): an 8B gate_up (2 x 14336 rows) and a ragged one."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tests.kernels.test_triton_quant import make_weight as codes_and_weight

    for inner, k in [(14336, 4096), (1000, 1536)]:
        packed, scales, biases = codes_and_weight(2 * inner, k, bits, group, dtype, m + inner, "cuda")[1:]
        x = torch.randn(m, k, device="cuda").to(dtype)
        out = td.gemv(x, packed, scales, biases, bits, group, gated=True)
        assert out.shape == (m, inner)
        assert rel_err(out, gated_reference(x, packed, scales, biases, bits, group)) < TOL[dtype]
