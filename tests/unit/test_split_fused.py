"""Phi-3's fused projections are split into q/k/v and gate/up row blocks, quantized or not."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.quant.affine import AffineWeight, quantize_affine
from lantern.app.models.spec import ModelConfig
from lantern.app.models.weight_stream import split_fused

CFG = dict(
    model_type="phi3",
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _spec() -> ModelSpec:
    return ModelSpec(name="t", config=ModelConfig.from_hf(CFG), weight_format="safetensors", weight_files=[])


def test_fused_rows_split_into_the_parts_every_model_file_takes():
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((64 + 2 * 32, 64)).astype(np.float32)  # q: 4 heads x 16, k and v: 2 x 16
    gate_up = quantize_affine(rng.standard_normal((2 * 96, 64)).astype(np.float32), 4, 32)
    norm = np.ones(64, np.float32)
    source = [
        ("model.layers.0.self_attn.qkv_proj.weight", qkv),
        ("model.layers.0.mlp.gate_up_proj.weight", gate_up),
        ("model.layers.0.input_layernorm.weight", norm),
    ]
    out = dict(split_fused(iter(source), _spec()))
    assert list(out) == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.input_layernorm.weight",
    ]
    np.testing.assert_array_equal(out["model.layers.0.self_attn.k_proj.weight"], qkv[64:96])
    up = out["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(up, AffineWeight) and up.mode == (4, 32)  # still quantized
    np.testing.assert_array_equal(up.dequantize(), gate_up.dequantize()[96:])


def test_a_fused_tensor_of_the_wrong_height_is_refused():
    source = [("model.layers.0.mlp.gate_up_proj.weight", np.zeros((100, 64), np.float32))]
    with pytest.raises(ValueError, match=r"gate_up_proj\.weight has 100 rows; the config implies 192"):
        list(split_fused(iter(source), _spec()))
