"""MLX's microscaled modes (mxfp4, nvfp4, mxfp8): reading config.json and the stored arrays, and the
exact shared form other backends take. The reference is MLX's own `mx.quantize` / `mx.dequantize`."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
from lantern.app.models.quant.hf_formats import parse_quant_scheme, quantized_module_names, read_quantized_module
from lantern.app.models.quant.microscaled import MODES, MxWeight
from lantern.app.models.spec import UnsupportedModelError

mx = pytest.importorskip("mlx.core")


def stored(mode: str, rows: int = 24, cols: int = 128, seed: int = 0) -> tuple[dict, np.ndarray]:
    bits, group = MODES[mode]
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    w[:, :group] *= 1e-3  # a group of small values: small exponents
    packed, scales = mx.quantize(mx.array(w), group_size=group, bits=bits, mode=mode)
    ref = mx.dequantize(packed, scales, None, group_size=group, bits=bits, mode=mode)
    return {"weight": np.array(packed), "scales": np.array(scales)}, np.array(ref.astype(mx.float32))


@pytest.mark.parametrize("mode", list(MODES))
def test_read_and_portable_form_are_exact(mode):
    scheme = parse_quant_scheme({"quantization": {"group_size": MODES[mode][1], "bits": MODES[mode][0], "mode": mode}})
    tensors, ref = stored(mode)
    w = read_quantized_module(scheme, "m", tensors)
    assert isinstance(w, MxWeight) and w.mode == mode and w.shape == ref.shape
    np.testing.assert_array_equal(w.dequantize(), ref)
    portable = w.portable()
    if mode == "mxfp8":  # e4m3 values with one power-of-two scale per 1x32 block
        assert isinstance(portable, Fp8Weight) and portable.block == (1, 32)
    else:  # twice each e2m1 value is a whole number -12..12: 5-bit codes, exact
        assert isinstance(portable, AffineWeight) and (portable.bits, portable.group_size) == (5, MODES[mode][1])
        assert portable.codes.max() <= 24 and len(np.unique(portable.codes)) <= 16  # -0 and 0 share a code
    np.testing.assert_array_equal(portable.dequantize(), ref)
    np.testing.assert_array_equal(w.rows(5, 9).dequantize(), ref[5:9])


def test_mode_is_inferred_from_shapes_where_config_json_does_not_say():
    """A per-module entry without "mode" is affine for mlx_lm; uint8 scales still say microscaled,
    and their shapes say which mode (as mlx_lm infers it)."""
    scheme = parse_quant_scheme({"quantization": {"group_size": 64, "bits": 4}})
    for mode in MODES:
        tensors, ref = stored(mode, seed=1)
        w = read_quantized_module(scheme, "m", tensors)
        assert w.mode == mode
        np.testing.assert_array_equal(w.dequantize(), ref)


def test_config_entries_and_members():
    q = {"group_size": 32, "bits": 4, "mode": "mxfp4", "lm_head": {"group_size": 64, "bits": 8}, "m.x": False}
    scheme = parse_quant_scheme({"quantization": q})
    assert scheme.mlx_mode_for("m.y") == "mxfp4" and scheme.mlx_mode_for("lm_head") == "affine"
    assert scheme.mode_for("lm_head") == (8, 64) and scheme.mode_for("m.x") is None
    names = quantized_module_names(scheme, ["m.weight", "m.scales", "a.weight", "a.scales", "a.biases"])
    assert names == {"m": ["m.weight", "m.scales"], "a": ["a.weight", "a.scales", "a.biases"]}


@pytest.mark.parametrize(
    ("quant", "key"),
    [
        ({"group_size": 64, "bits": 4, "mode": "mxfp4"}, "quantization="),  # mxfp4 is 4-bit g32 only
        ({"group_size": 32, "bits": 4, "mode": "fp6"}, "quantization.mode"),
        (
            {"group_size": 32, "bits": 4, "mode": "mxfp4", "m": {"mode": "nvfp4", "bits": 4, "group_size": 32}},
            "quantization.m=",
        ),
    ],
)
def test_inconsistent_modes_are_refused_by_name(quant, key):
    with pytest.raises(UnsupportedModelError) as err:
        parse_quant_scheme({"quantization": quant})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_mlx_global_scale_is_read_and_nan_scales_are_refused():
    """mlx_lm's nvfp4 tensor scale g: w = e2m1 * scale * g / (6 * 448), as mx.dequantize computes it."""
    scheme = parse_quant_scheme({"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}})
    tensors, _ = stored("nvfp4")
    plain = read_quantized_module(scheme, "m", tensors)
    scaled = read_quantized_module(scheme, "m", {**tensors, "global_scale": np.array([5.0], np.float32)})
    assert plain.global_scale == 1.0 and scaled.global_scale == pytest.approx(5.0 / 2688)
    np.testing.assert_array_equal(scaled.packed, plain.packed)
    mx_scheme = parse_quant_scheme({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})
    mx_tensors, _ = stored("mxfp4")
    with pytest.raises(ValueError, match=r"m\.global_scale with mxfp4"):
        read_quantized_module(mx_scheme, "m", {**mx_tensors, "global_scale": np.ones(1, np.float32)})
    scales = tensors["scales"].copy()
    scales[0, 0] = 0x7F  # e4m3 NaN
    with pytest.raises(ValueError, match=r"^m: a nvfp4 group scale is NaN"):  # at read: MLX would compute NaNs
        read_quantized_module(scheme, "m", {**tensors, "scales": scales})


def test_compressed_tensors_and_modelopt_schemes_are_checked():
    ct = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": None}},
    }
    weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
    for bad, key in (({"symmetric": False}, "weights.symmetric"), ({"scale_dtype": "torch.uint8"}, "scale_dtype")):
        ct["config_groups"]["g"]["weights"] = {**weights, **bad}
        with pytest.raises(UnsupportedModelError, match=key):
            parse_quant_scheme({"quantization_config": ct})
    nested = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    scheme = parse_quant_scheme({"quantization_config": nested})
    assert (scheme.method, scheme.mlx_mode) == ("modelopt-fp4", "nvfp4")


def test_global_scaled_layer_in_float16_and_in_a_dense_latent_matrix():
    """An NVFP4 tensor with a global scale: in float16 the layer stays finite (the unscaled products
    would overflow it), and DeepSeek's dense kv_b matrix carries the global scale."""
    import mlx.nn as nn

    from lantern.app.models.quant.affine import ErrorLog
    from lantern.app.models.quant.modelopt import read_fp4
    from lantern.backends.mlx.quant import GlobalScaledQuantizedLinear, quantized_module

    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((32, 256)).astype(np.float32)
    # as NVFP4 exports store them: block scales near e4m3's top (448), the tensor's size in the global factor
    packed, scales = mx.quantize(mx.array(w0 * 2688), group_size=16, bits=4, mode="nvfp4")
    tensors = {"weight": np.array(packed), "scales": np.array(scales)}
    scheme = parse_quant_scheme(
        {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}}
    )
    packed_bytes = tensors["weight"].view(np.uint8)
    w = read_fp4(scheme, "m", {"weight": packed_bytes, "weight_scale": tensors["scales"], "weight_scale_2": 1 / 2688})
    assert w.global_scale == float(np.float32(1 / 2688))  # the stored float32
    layer, arrays = quantized_module(nn.Linear(256, 32, bias=False), w, mx.float16, ErrorLog())
    assert isinstance(layer, GlobalScaledQuantizedLinear)
    layer.load_weights(list(arrays.items()), strict=True)
    x = rng.standard_normal((2, 256)).astype(np.float32) * 3
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    y = np.array(layer(mx.array(x).astype(mx.float16)).astype(mx.float32))
    assert np.isfinite(y).all() and np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-3
    from lantern.backends.mlx.models.deepseek import MLAttention

    holder = MLAttention.__new__(MLAttention)
    nn.Module.__init__(holder)
    holder.kv_b_proj = layer
    MLAttention.dense_kv_b(holder, mx.float32)
    np.testing.assert_allclose(np.array(holder.kv_b_proj.weight), w.dequantize(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("tokens", [3, 40])  # 40 tokens x 2 experts take the sorted gather (SORT_MIN_PAIRS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_experts_with_global_scales_match_a_dense_reference(tokens, dtype):
    """QuantExpertLinear with one NVFP4 global scale per expert (the stacked experts of a compressed-
    tensors / ModelOpt MoE) against each expert's dequantized matrix times its scale, through the
    gated MLP of Experts, unsorted and sorted gathers, float32 and float16 (whose unscaled products
    would overflow without the float32 promotion)."""
    from lantern.backends.mlx.moe import SORT_MIN_PAIRS, QuantExpertLinear

    experts, hidden, out, k = 4, 64, 32, 2
    assert (tokens * k >= SORT_MIN_PAIRS) == (tokens == 40)
    rng = np.random.default_rng(5)
    scales_g = np.array([0.5, 3.0, 1.0, 7.0], np.float32) / 2688  # exports: block scales near 448, tensor size here
    weights = [
        mx.quantize(
            mx.array(rng.standard_normal((out, hidden)).astype(np.float32) * 2688), group_size=16, bits=4, mode="nvfp4"
        )
        for _ in range(experts)
    ]
    layer = QuantExpertLinear(experts, hidden, out, 4, 16, "nvfp4", global_scale=True)
    layer.update(
        {
            "weight": mx.stack([w[0] for w in weights]),
            "scales": mx.stack([w[1] for w in weights]),
            "global_scale": mx.array(scales_g),
        }
    )
    dense = np.stack(
        [np.array(mx.dequantize(w[0], w[1], group_size=16, bits=4, mode="nvfp4", dtype=mx.float32)) for w in weights]
    )
    dense *= scales_g[:, None, None]
    x = rng.standard_normal((tokens, hidden)).astype(np.float32) * 4
    idx = rng.integers(0, experts, (tokens, k))
    ref = np.einsum("th,tkoh->tko", x.astype(np.float64), dense[idx].astype(np.float64))
    xd = mx.array(x).astype(getattr(mx, dtype))
    if tokens * k < SORT_MIN_PAIRS:
        y = np.array(layer(xd[:, None, None, :], mx.array(idx), False).astype(mx.float32))[:, :, 0]
    else:
        flat = idx.reshape(-1)
        order = np.argsort(flat, kind="stable")
        ys = np.array(layer(xd[mx.array(order // k)][:, None, :], mx.array(flat[order]), True).astype(mx.float32))
        y = np.empty_like(ys)
        y[order] = ys
        y = y.reshape(tokens, k, out)
    assert np.isfinite(y).all()
    assert np.abs(y - ref).max() / np.abs(ref).max() < (1e-5 if dtype == "float32" else 2e-3)
