"""GPTQ act-order weights (`AffineWeight.perm`): held exactly with sorted columns, x gathered by the layer.

The reference is always the matrix in input order built here from the same codes, scales and biases
with plain numpy indexing (w[:, perm[j]] = stored[:, j]), and F.linear / x @ w.T on it: nothing of the
layers' own gather is reused to check them.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the CUDA path runs on CPU

import importlib.util

import numpy as np
import pytest
import torch.nn.functional as F

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, concat_rows, in_input_order, regroup, same_perm
from lantern.app.models.quant.hf_formats import act_order_perm
from lantern.app.models.spec import UnsupportedModelError

HAS_MLX = importlib.util.find_spec("mlx") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
N, K, GROUP = 48, 256, 32


def permuted(rows: int = N, cols: int = K, bits: int = 4, group: int = GROUP, seed: int = 0) -> AffineWeight:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, (rows, cols), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.03, (rows, cols // group)).astype(np.float32)
    biases = (-scales * (1 << (bits - 1)) + rng.normal(0, 0.01, scales.shape)).astype(np.float32)
    perm = rng.permutation(cols).astype(np.int32)
    return AffineWeight(codes, scales, biases, bits, group, "test act-order", perm)


def input_order(w: AffineWeight) -> np.ndarray:
    """The reference matrix: stored column j is input column perm[j]."""
    stored = w.codes.astype(np.float64) * np.repeat(w.scales.astype(np.float64), w.group_size, 1) + np.repeat(
        w.biases.astype(np.float64), w.group_size, 1
    )
    out = np.zeros_like(stored)
    for j, i in enumerate(w.perm):
        out[:, i] = stored[:, j]
    return out


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


# ---- the affine form ---------------------------------------------------------------------------------
def test_dequantize_is_in_input_order_and_rows_keep_the_permutation():
    w = permuted()
    np.testing.assert_allclose(w.dequantize(), input_order(w), rtol=1e-6, atol=1e-6)
    part = w.rows(8, 20)
    np.testing.assert_array_equal(part.perm, w.perm)
    np.testing.assert_allclose(part.dequantize(), input_order(w)[8:20], rtol=1e-6, atol=1e-6)
    assert w.stored().perm is None and w.stored().codes is w.codes
    wide = permuted(group=64)
    np.testing.assert_array_equal(regroup(wide, (32,)).perm, wide.perm)  # a split group keeps the gather
    with pytest.raises(ValueError, match="act-order"):
        w.cols(0, 128)  # a column range of a permuted weight is not a group range


def test_stacking_needs_one_permutation():
    a, b = permuted(seed=1), permuted(seed=1)
    assert same_perm([a, b]) and not same_perm([a, permuted(seed=2)]) and not same_perm([a, a.stored()])
    stacked = concat_rows([a, b])
    np.testing.assert_allclose(stacked.dequantize(), np.concatenate([input_order(a), input_order(b)]), atol=1e-6)
    with pytest.raises(ValueError, match="permutations differ"):
        concat_rows([a, permuted(seed=2)])


def test_in_input_order_requantizes_to_8_bits_and_logs():
    w, errors = permuted(), ErrorLog()
    plain = in_input_order(w, errors, "stacked experts")
    assert plain.perm is None and plain.bits == 8 and plain.group_size == GROUP
    assert np.abs(plain.dequantize() - input_order(w)).max() < 0.6 * plain.scales.max()  # within half a step
    ((source, target), (worst, count)), *_ = errors.worst.items()
    assert "act-order" in source and "stacked experts" in target and count == 1 and 0 < worst < 0.01
    assert in_input_order(plain, errors, "x") is plain


# ---- reading g_idx ---------------------------------------------------------------------------------------
def test_act_order_perm_sorts_columns_into_their_groups():
    rng = np.random.default_rng(3)
    order = rng.permutation(128)
    g_idx = np.empty(128, np.int32)
    g_idx[order] = np.arange(128) // 32  # GPTQ numbers the groups along its column order
    perm = act_order_perm(g_idx, 128, 32, "m.g_idx")
    np.testing.assert_array_equal(g_idx[perm], np.arange(128) // 32)  # stored column j is in group j // 32
    assert sorted(perm) == list(range(128))
    assert act_order_perm(np.arange(128) // 32, 128, 32, "m.g_idx") is None  # contiguous: nothing to gather
    assert act_order_perm(None, 128, 32, "m.g_idx") is None


def test_act_order_perm_refuses_uneven_or_out_of_range_groups():
    uneven = np.arange(128) // 32
    uneven[0] = 1  # group 0 has 31 columns, group 1 has 33
    with pytest.raises(UnsupportedModelError, match=r"m\.g_idx puts unequal numbers"):
        act_order_perm(uneven, 128, 32, "m.g_idx")
    with pytest.raises(ValueError, match=r"m\.g_idx"):
        act_order_perm(np.full(128, 4), 128, 32, "m.g_idx")  # only groups 0..3 exist
    with pytest.raises(ValueError, match=r"m\.g_idx"):
        act_order_perm(np.zeros(64), 128, 32, "m.g_idx")


# ---- torch layers: every kernel --------------------------------------------------------------------------
def torch_kernels() -> list[str]:
    from lantern.backends.torch import cpu_vnni_gemm
    from lantern.backends.torch.packed_decode import int4pack_layout_ok

    kernels = ["int8pack", "dense"]
    if cpu_vnni_gemm.available():
        kernels.append("vnni")
    if int4pack_layout_ok():
        kernels.append("int4pack")
    if HAS_TRITON:
        kernels.append("triton")
    return kernels


@pytest.mark.parametrize("kernel", ["vnni", "int4pack", "int8pack", "triton", "dense"])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_torch_layer_gathers_x_on_every_kernel(kernel, rows):
    from lantern.backends.torch.quant_layer import PermutedInput
    from lantern.backends.torch.quant_linear import quantized_linear

    if kernel not in torch_kernels():
        pytest.skip(f"{kernel} does not run on this machine")
    if kernel == "triton" and not torch.cuda.is_available():
        from triton.runtime.interpreter import InterpretedFunction

        from lantern.backends.torch.kernels import triton_quant

        if not isinstance(triton_quant._gemm_kernel, InterpretedFunction):
            pytest.skip("triton_quant was imported before TRITON_INTERPRET=1 was set")
    device = "cuda" if kernel == "triton" and torch.cuda.is_available() else "cpu"
    w = permuted()
    bias = torch.randn(N)
    layer = quantized_linear(w, bias, device, torch.float32, ErrorLog(), kernel=kernel)
    assert isinstance(layer, PermutedInput)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
    ref = F.linear(x.double(), torch.from_numpy(input_order(w)), bias.double())
    y = layer(x.to(device)).cpu()
    # int8pack requantizes to per-channel int8 (one step of 1/127 of the row's range) and the CPU
    # kernels run bf16 activations: 2**-6 as in test_torch_quant_linear; float32 paths far closer.
    assert rel(y, ref) < (2.0**-6 if kernel in ("int8pack", "int4pack", "vnni") else 1e-5), kernel
    # Without a bias a 2-D input takes the layer's short path; a 3-D one the generic reshape.
    bare = quantized_linear(w, None, device, torch.float32, ErrorLog(), kernel=kernel)
    bare_ref = F.linear(x.double(), torch.from_numpy(input_order(w)))
    assert rel(bare(x.to(device)).cpu(), bare_ref) < (2.0**-6 if kernel in ("int8pack", "int4pack", "vnni") else 1e-5)
    assert torch.equal(bare(x[None].to(device)).cpu()[0], bare(x.to(device)).cpu())
    # A wrong gather (x unpermuted) is far off: the check can fail.
    wrong = F.linear(x.double(), torch.from_numpy(w.stored().dequantize()).double(), bias.double())
    assert rel(wrong, ref) > 0.3


def test_torch_permuted_embedding_rows_are_in_input_order():
    from lantern.backends.torch.quant_linear import quantized_embedding

    w = permuted(rows=64)
    table = quantized_embedding(w, "cpu", torch.float32, ErrorLog(), kernel="dense")
    ids = torch.tensor([[3, 0, 63]])
    np.testing.assert_allclose(table(ids)[0].numpy(), input_order(w)[[3, 0, 63]], rtol=1e-5, atol=1e-6)


def test_torch_stacked_parts_with_different_permutations():
    """gate and up of one act-order file may gather differently: they stay separate layers."""
    from lantern.backends.torch.weights import _Loader

    gate, up = permuted(seed=4), permuted(seed=5)
    loader = _Loader.__new__(_Loader)
    loader.device, loader.dtype, loader.errors = torch.device("cpu"), torch.float32, ErrorLog()
    layer = loader.quantized_layer("model.layers.0.mlp.gate_up_proj", [gate, up])
    x = torch.randn(3, K)
    ref = F.linear(x.double(), torch.from_numpy(np.concatenate([input_order(gate), input_order(up)])))
    assert rel(layer(x), ref) < 2.0**-6


# ---- MLX -------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_MLX, reason="mlx not installed")
def test_mlx_layer_gathers_x_and_embeddings_go_to_input_order():
    import mlx.core as mx
    import mlx.nn as nn

    from lantern.backends.mlx.quant import PermutedQuantizedLinear, quantized_module

    w, errors = permuted(), ErrorLog()
    layer, arrays = quantized_module(nn.Linear(K, N, bias=False), w, mx.float32, errors)
    assert isinstance(layer, PermutedQuantizedLinear)
    layer.load_weights(list(arrays.items()), strict=True)
    from lantern.backends.mlx.runner import _count_params

    assert _count_params(layer) == N * K  # the gather's indices are not weights
    x = np.random.default_rng(7).standard_normal((3, K)).astype(np.float32)
    y = np.array(layer(mx.array(x)))
    ref = x.astype(np.float64) @ input_order(w).T
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5
    deq = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=layer.bits)
    np.testing.assert_allclose(np.array(layer.input_order(deq)), input_order(w), rtol=1e-5, atol=1e-6)
    emb, arrays = quantized_module(nn.Embedding(N, K), w, mx.float32, errors)  # a lookup has no input to gather
    emb.load_weights(list(arrays.items()), strict=True)
    rows = np.array(emb(mx.array([0, 5])))
    assert np.abs(rows - input_order(w)[[0, 5]]).max() < 0.6 * float(np.array(emb.scales).max())
    assert any("embedding" in target for _, target in errors.worst), errors.worst
