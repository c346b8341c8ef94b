"""Quantized HF folders (MLX-community, AWQ, GPTQ, FP8, compressed-tensors): config parsing and exact reading.

The folders are written by tests/fixtures/hf_quant_writers.py; their references are values nobody
here computed by hand: `mx.dequantize` (MLX), torch's float8_e4m3fn cast (FP8), and for AWQ/GPTQ the
random integers themselves before the test packed them. The packing conventions are also pinned by
hand-computed words, which a reader with the wrong nibble order or zero offset fails.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pickle

import numpy as np
import pytest

from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
from lantern.app.models.quant.hf_formats import (
    QuantScheme,
    parse_quant_scheme,
    quantized_module_names,
    read_quantized_module,
)
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mixed import module_scheme
from lantern.app.models.quant.modelopt import config_from_folder
from lantern.app.models.spec import ModelConfig, UnsupportedModelError

HAS_MLX = importlib.util.find_spec("mlx") is not None
BASE = {
    "model_type": "llama",
    "vocab_size": 400,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
CASES = [
    ("mlx4", "llama2"),
    ("mlx8", "llama2"),
    ("mlx_mixed", "llama2"),
    ("awq", "llama2"),
    ("awq", "qwen2"),  # q/k/v biases stay plain tensors beside the packed weights
    ("gptq", "llama2"),
    ("gptq_asym", "qwen2"),
    ("gptq8", "llama2"),
    ("gptq_v2", "llama2"),
    ("gptq3", "llama2"),
    ("gptq2", "qwen2"),
    ("gptq_act", "qwen2"),  # act-order: columns sorted into their groups, the permutation kept
    ("gptq_dynamic", "llama2"),  # GPTQModel's per-module regexes: other bits / groups, or float
    ("autoround", "qwen2"),  # AutoRound over GPTQ v1 packing, extra_config per module
    ("autoround_awq", "llama2"),  # AutoRound over AWQ GEMM packing
    ("fp8", "llama2"),
    ("fbgemm_fp8", "llama2"),
    ("fp8_tensor", "llama2"),
    ("bnb_nf4", "llama2"),
    ("bnb_fp4", "qwen2"),
    ("bnb8", "llama2"),
    ("ct_w4a16", "llama2"),
    ("ct_w4_asym", "qwen2"),
    ("ct_w4_act", "llama2"),
    ("ct_nvfp4", "llama2"),  # microscaled floats: read as stored (MxWeight), exact through the shared form
    ("ct_mxfp4", "qwen2"),
    ("ct_mxfp8", "llama2"),
    ("modelopt_fp8", "llama2"),
    ("modelopt_nvfp4", "qwen2"),  # described by hf_quant_config.json only
    ("ct_w8a16", "llama2"),
    ("ct_w8a8", "llama2"),
    ("ct_fp8", "llama2"),
    ("ct_fp8_block", "llama2"),
    ("modelopt_mixed", "llama2"),  # MIXED_PRECISION: FP8, FP8 blocks, NVFP4, MXFP8 and float modules
    ("modelopt_mxfp8", "qwen2"),
    ("ct_mixed", "qwen2"),  # compressed-tensors mixed-precision: groups by name, re: pattern and Linear
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("torch")  # the writers build the float model with transformers
    from tests.fixtures.hf_quant_writers import writer

    root = tmp_path_factory.mktemp("hfq")
    cache: dict[tuple[str, str], tuple] = {}

    def get(kind: str, variant: str = "llama2"):
        if (kind, variant) not in cache:
            cache[kind, variant] = writer(kind, root, variant)
        return cache[kind, variant]

    return get


def load_tensors(path) -> dict[str, np.ndarray]:
    """A safetensors file as numpy the way a loader hands it over: bf16 widened, float8 as its bits."""
    import torch
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dtype == torch.bfloat16:
                t = t.float()
            elif t.dtype == torch.float8_e4m3fn:
                t = t.view(torch.uint8)
            out[name] = t.numpy()
    return out


def read_folder(folder):
    cfg = config_from_folder(json.loads((folder / "config.json").read_text()), folder)
    scheme = parse_quant_scheme(cfg)
    tensors = load_tensors(folder / "model.safetensors")
    modules = quantized_module_names(scheme, tensors)
    weights = {
        prefix: read_quantized_module(scheme, prefix, {n[len(prefix) + 1 :]: tensors[n] for n in names})
        for prefix, names in modules.items()
    }
    return scheme, tensors, modules, weights


# ---- whole folders ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, variant", CASES)
def test_every_quantized_module_reads_exactly_to_the_reference_weights(folders, kind, variant):
    quant, ref = folders(kind, variant)
    scheme, tensors, modules, weights = read_folder(quant)
    reference = load_tensors(ref / "model.safetensors")
    assert "quantization_config" not in json.loads((ref / "config.json").read_text())
    members = {n for names in modules.values() for n in names}
    plain = {n for n in tensors if n not in members and not n.endswith((".k_scale", ".v_scale"))}  # KV scales: unused
    # The reference is every module's weight plus every plain tensor, nothing else.
    assert set(reference) == plain | {f"{p}.weight" for p in modules}
    assert not any(n.endswith(".bias") for n in members)
    projections = 7 * 2
    expected = {"mlx4": projections + 2, "mlx8": projections + 2, "mlx_mixed": projections + 1}.get(kind, projections)
    kept_float = ("gptq_dynamic", "autoround", "autoround_awq", "modelopt_mixed", "ct_mixed")
    expected -= kind in kept_float  # one module each kept float by the config
    assert len(modules) == expected
    for prefix, w in weights.items():
        exact = reference[f"{prefix}.weight"]
        own = module_scheme(scheme, prefix) if scheme.method == "mixed" else scheme
        if own.method in ("ct-fp4", "ct-mxfp8", "modelopt-fp4", "modelopt-mxfp8"):
            assert isinstance(w, MxWeight) and w.mode == own.mlx_mode
            np.testing.assert_allclose(w.portable().dequantize(), exact, rtol=1e-6, atol=1e-6, err_msg=prefix)
            continue
        assert isinstance(w, Fp8Weight if own.method == "fp8" else AffineWeight)
        if kind.startswith("ct_w") and scheme.method != "fp8":
            assert w.bits == scheme.bits and w.codes.max() < 2**w.bits
        assert w.shape == exact.shape
        if kind in ("bnb_nf4", "bnb_fp4"):  # levels held to within half a 1/127 step of each block's absmax
            blocks = np.abs(exact).reshape(exact.shape[0], -1, 64).max(axis=-1, keepdims=True)
            err = np.abs(w.dequantize() - exact).reshape(blocks.shape[0], -1, 64)
            assert (err <= blocks * (0.5 / 127 + 1e-6)).all(), prefix
            continue
        np.testing.assert_allclose(w.dequantize(), exact, rtol=1e-6, atol=1e-6, err_msg=prefix)
    for name in plain:  # plain tensors go through unchanged
        np.testing.assert_array_equal(tensors[name], reference[name])


def test_mlx_per_module_entries_set_each_modules_mode(folders):
    quant, _ = folders("mlx_mixed")
    scheme, tensors, modules, weights = read_folder(quant)
    assert scheme.overrides["model.layers.1.self_attn.v_proj"] is None
    assert "model.layers.1.self_attn.v_proj" not in modules
    assert tensors["model.layers.1.self_attn.v_proj.weight"].dtype == np.float32
    assert weights["model.embed_tokens"].mode == (8, 32)
    assert weights["model.layers.0.mlp.down_proj"].mode == (6, 128)
    assert weights["model.layers.1.mlp.down_proj"].mode == (4, 64)


@pytest.mark.skipif(not HAS_MLX, reason="mlx not installed")
@pytest.mark.parametrize("kind", ["mlx4", "mlx8", "mlx_mixed"])
def test_mlx_reader_equals_mx_dequantize_of_the_same_tensors(folders, kind):
    import mlx.core as mx

    quant, _ = folders(kind)
    _, tensors, _, weights = read_folder(quant)
    for prefix, w in weights.items():
        expected = mx.dequantize(
            mx.array(tensors[f"{prefix}.weight"]),
            mx.array(tensors[f"{prefix}.scales"].astype(np.float32)),
            mx.array(tensors[f"{prefix}.biases"].astype(np.float32)),
            group_size=w.group_size,
            bits=w.bits,
        )
        np.testing.assert_allclose(w.dequantize(), np.array(expected), rtol=1e-6, atol=1e-6, err_msg=prefix)


@pytest.mark.skipif(importlib.util.find_spec("mlx_lm") is None, reason="mlx_lm not installed")
def test_mlx_folder_runs_in_mlx_lm_as_its_reference_runs_in_transformers(folders):
    """mlx_lm reading the written folder (per-module entries, a skipped module, 6-bit) computes what
    transformers computes on the reference folder: the fixture is a real MLX-community folder."""
    import mlx.core as mx
    import torch
    from mlx_lm.utils import load_model
    from transformers import AutoModelForCausalLM

    quant, ref = folders("mlx_mixed")
    model, _ = load_model(quant)
    model.set_dtype(mx.float32)  # the stored bf16 scales, computed in float32 like the reference
    ids = [5, 17, 42, 99, 120, 7]
    got = np.array(model(mx.array([ids])))
    hf = AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())


# ---- packing conventions pinned by hand-computed words ---------------------------------------------
def test_awq_words_hold_output_columns_in_awq_order():
    # Output columns 0..7 with codes 0..7: nibble i holds column AWQ_ORDER[i] = 0,2,4,6,1,3,5,7.
    qweight = np.full((4, 1), 0x75316420, dtype=np.int32)  # 4 input rows, 8 output columns
    # Zeros 7,6,...,0 for columns 0..7, in the same order: nibbles 7,5,3,1,6,4,2,0.
    qzeros = np.array([[0x02461357]], dtype=np.int32)
    scales = np.full((1, 8), 0.5, dtype=np.float16)
    scheme = QuantScheme("awq", 4, 4)
    w = read_quantized_module(scheme, "p", {"qweight": qweight, "qzeros": qzeros, "scales": scales})
    assert w.shape == (8, 4)
    np.testing.assert_array_equal(w.codes, np.repeat(np.arange(8), 4).reshape(8, 4))
    expected = (np.arange(8) - (7 - np.arange(8))) * 0.5  # (q - z) * s, the same along each row
    np.testing.assert_array_equal(w.dequantize(), np.repeat(expected, 4).reshape(8, 4))


def test_gptq_v1_zeros_are_stored_minus_one_and_words_run_along_the_input():
    # One word per output column: input rows 0..7 hold codes 0..7 (value j at bits 4j).
    qweight = np.full((1, 8), 0x76543210, dtype=np.int32)
    # Stored zeros 7,6,...,0 for output columns 0..7 (column j at bits 4j): v1 zeros are 8 - j.
    qzeros = np.array([[0x01234567]], dtype=np.int32)
    scales = np.full((1, 8), 0.25, dtype=np.float16)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": np.zeros(8, dtype=np.int32)}
    v1 = read_quantized_module(QuantScheme("gptq", 4, 8, checkpoint_format="gptq"), "p", tensors)
    np.testing.assert_array_equal(v1.codes, np.tile(np.arange(8), (8, 1)))
    zero = 8 - np.arange(8)
    np.testing.assert_array_equal(v1.dequantize(), (np.arange(8)[None, :] - zero[:, None]) * 0.25)
    v2 = read_quantized_module(QuantScheme("gptq", 4, 8, checkpoint_format="gptq_v2"), "p", tensors)
    np.testing.assert_array_equal(v2.dequantize(), (np.arange(8)[None, :] - (zero - 1)[:, None]) * 0.25)


def test_gptq_3bit_values_straddle_words_as_one_bit_stream():
    """AutoGPTQ's 3-bit packing: 32 input rows in 3 words per column, value k at bit 3k of the
    96-bit stream (value 10 splits 2 + 1 bits over words 0 and 1, value 21 splits 1 + 2). Codes
    0..7 repeated give these words (worked out from the packing loop by hand)."""
    qweight = np.array([[0x88FAC688], [0xC688FAC6], [0xFAC688FA]], dtype=np.uint32).view(np.int32)  # [3, 1]
    qweight = np.repeat(qweight, 32, axis=1)  # 32 output columns (qzeros packs them 3 words wide)
    qzeros = np.array([[0x88FAC688, 0xC688FAC6, 0xFAC688FA]], dtype=np.uint32).view(np.int32)  # zero of column j: j % 8
    scales = np.full((1, 32), 0.5, dtype=np.float16)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    w = read_quantized_module(QuantScheme("gptq", 3, 32, sym=False, checkpoint_format="gptq_v2"), "p", tensors)
    assert w.shape == (32, 32)
    np.testing.assert_array_equal(w.codes, np.tile(np.arange(32) % 8, (32, 1)))
    zero = np.arange(32) % 8
    np.testing.assert_array_equal(w.dequantize(), (np.arange(32)[None, :] % 8 - zero[:, None]) * 0.5)


def test_gptq_v1_stored_fifteen_is_a_zero_of_zero():
    """AutoGPTQ reads v1 zeros as (stored + 1) mod 2**bits: a stored 15 (zero 0 - 1) means zero 0."""
    tensors = {
        "qweight": np.full((1, 8), 0x76543210, dtype=np.int32),
        "qzeros": np.array([[-1]], dtype=np.int32),  # every nibble 15
        "scales": np.ones((1, 8), dtype=np.float16),
    }
    w = read_quantized_module(QuantScheme("gptq", 4, 8, checkpoint_format="gptq"), "p", tensors)
    np.testing.assert_array_equal(w.dequantize(), np.tile(np.arange(8.0), (8, 1)))


def test_gptq_act_order_reads_exactly_with_sorted_columns(folders):
    """desc_act files scatter each group's input columns (g_idx): the reader sorts them into contiguous
    groups and keeps the permutation; the matrix in input order is the file's exactly."""
    quant, ref = folders("gptq_act")
    scheme = parse_quant_scheme(json.loads((quant / "config.json").read_text()))
    assert scheme.desc_act
    _, tensors, _, _ = read_folder(quant)
    refs = load_tensors(ref / "model.safetensors")
    for prefix in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.k_proj"):
        parts = {s: tensors[f"{prefix}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx")}
        w = read_quantized_module(scheme, prefix, parts)
        assert w.perm is not None and "act-order" in w.source
        np.testing.assert_array_equal(parts["g_idx"][w.perm], np.arange(w.shape[1]) // 32)
        np.testing.assert_allclose(w.dequantize(), refs[f"{prefix}.weight"], atol=1e-6)
        contiguous = {**parts, "g_idx": np.arange(w.shape[1], dtype=np.int32) // 32}  # the same file read plainly
        assert read_quantized_module(scheme, prefix, contiguous).perm is None


def test_gptq_g_idx_with_uneven_groups_is_refused_by_name(folders):
    quant, _ = folders("gptq")
    _, tensors, _, _ = read_folder(quant)
    prefix = "model.layers.0.mlp.down_proj"
    parts = {s: tensors[f"{prefix}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx")}
    parts["g_idx"] = parts["g_idx"].copy()
    parts["g_idx"][0] = 1
    scheme = QuantScheme("gptq", 4, 128, sym=True, desc_act=True, checkpoint_format="gptq")
    with pytest.raises(UnsupportedModelError) as err:
        read_quantized_module(scheme, prefix, parts)
    message = str(err.value)
    assert f"{prefix}.g_idx" in message and "unequal" in message and "\n" not in message


def test_a_module_missing_a_member_is_named():
    scheme = QuantScheme("awq", 4, 128)
    with pytest.raises(ValueError, match=r"model\.x\.qzeros"):
        quantized_module_names(scheme, ["model.x.qweight", "model.x.scales", "model.x.bias"])
    fp8 = QuantScheme("fp8", 8, 0, weight_block_size=(128, 128))
    names = ["a.weight", "a.weight_scale", "a.input_scale", "a.bias", "b.weight"]
    assert quantized_module_names(fp8, names) == {"a": ["a.weight", "a.weight_scale", "a.input_scale"]}


def test_fp8_input_scale_is_ignored_with_a_log_line(folders, caplog):
    import lantern.app.models.quant.hf_formats as hf_formats

    quant, _ = folders("fp8_tensor")
    hf_formats._noted_input_scale = False
    with caplog.at_level(logging.INFO, logger=hf_formats.__name__):
        _, _, modules, weights = read_folder(quant)
    assert all(n.endswith(".input_scale") for names in modules.values() for n in names[2:])
    assert all(w.block is None and w.scale.shape == () for w in weights.values())
    assert sum("input_scale" in r.message for r in caplog.records) == 1


# ---- config.json ------------------------------------------------------------------------------------
def test_written_configs_parse_to_their_schemes(folders):
    expected = {
        "mlx4": ("mlx", 4, 64),
        "awq": ("awq", 4, 128),
        "gptq_asym": ("gptq", 4, 64),
        "gptq8": ("gptq", 8, -1),
        "gptq_v2": ("gptq", 4, 64),
        "fp8": ("fp8", 8, 0),
        "ct_w4a16": ("ct-pack", 4, 64),
        "ct_w4_asym": ("ct-pack", 4, 32),
        "ct_w8a16": ("ct-pack", 8, -1),
        "ct_w8a8": ("ct-int", 8, -1),
        "ct_fp8": ("fp8", 8, 0),
    }
    for kind, (method, bits, group) in expected.items():
        config = ModelConfig.from_hf(json.loads((folders(kind)[0] / "config.json").read_text()))
        scheme = config.quantization
        assert (scheme.method, scheme.bits, scheme.group_size) == (method, bits, group), kind
        assert pickle.loads(pickle.dumps(config)) == config  # ModelSpec travels to worker processes

    def scheme_of(kind: str) -> QuantScheme:
        return parse_quant_scheme(json.loads((folders(kind)[0] / "config.json").read_text()))

    assert scheme_of("gptq_asym").checkpoint_format == "gptq" and not scheme_of("gptq_asym").sym
    assert scheme_of("gptq").sym and scheme_of("gptq_v2").checkpoint_format == "gptq_v2"
    assert scheme_of("fp8").weight_block_size == (128, 128)
    assert scheme_of("ct_fp8_block").weight_block_size == (128, 128) and scheme_of("ct_fp8").weight_block_size is None
    assert scheme_of("ct_w4a16").sym and not scheme_of("ct_w4_asym").sym
    assert scheme_of("ct_w4a16").modules_to_not_convert == ("lm_head",)
    per_tensor = scheme_of("fp8_tensor")
    assert per_tensor.weight_block_size is None and per_tensor.modules_to_not_convert == ("lm_head",)


def test_float_configs_have_no_scheme():
    assert ModelConfig.from_hf(dict(BASE)).quantization is None
    assert parse_quant_scheme({"quantization_config": None}) is None


CT_W4 = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}
CT_W8 = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}
CT_FP4 = {
    "targets": ["Linear"],
    "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
}
REFUSED = [
    ({"quant_method": "bitsandbytes"}, "quantization_config.load_in_4bit=null"),
    (
        {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
        'quantization_config.bnb_4bit_quant_storage="bfloat16"',
    ),
    (
        {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
        'quantization_config.bnb_4bit_quant_type="int4"',
    ),
    ({"quant_method": "exl2", "bits": 4.65}, 'quantization_config.quant_method="exl2"'),
    ({"quant_method": "hqq", "nbits": 4}, 'quantization_config.quant_method="hqq"'),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "quantization_config.config_groups=null"),
    (
        {"quant_method": "compressed-tensors", "format": "sparse-24-bitmask", "config_groups": {"g": CT_W4}},
        'config_groups.g.format="sparse-24-bitmask"',
    ),
    (
        {"quant_method": "compressed-tensors", "format": "mxfp6-pack-quantized", "config_groups": {"g": CT_FP4}},
        'config_groups.g.format="mxfp6-pack-quantized"',
    ),
    ({"quant_method": "modelopt", "quant_algo": "INT4_AWQ"}, 'quantization_config.quant_algo="INT4_AWQ"'),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "quantization_config.group_size=32"),
    (  # nvfp4 is 4-bit floats in groups of 16
        {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"g": CT_W4}},
        "config_groups.g.weights=",
    ),
    (  # several groups: a class target other than Linear names no modules here
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"a": CT_W4, "b": {**CT_W8, "targets": ["LlamaAttention"]}},
        },
        'config_groups.b.targets="LlamaAttention"',
    ),
    (  # mixed-precision names each group's own format
        {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {"a": CT_W4, "b": CT_W8}},
        'config_groups.a.format="mixed-precision"',
    ),
    (  # bare MIXED_PRECISION (W4AFP8 exports): no per-module map
        {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
        'quantization_config.quant_algo="MIXED_PRECISION"',
    ),
    (
        {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"m.a": {"quant_algo": "FP8"}, "m.b": {"quant_algo": "W4A8_AWQ", "group_size": 128}},
        },
        'quantization_config.quantized_layers.m.b.quant_algo="W4A8_AWQ"',
    ),
    (
        {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"m.a": {"quant_algo": "NVFP4", "group_size": 32}},
        },
        "quantization_config.quantized_layers.m.a.group_size=32",
    ),
    ({"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 64}, "quantization_config.group_size=64"),
    (
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"g": CT_W4},
            "transform_config": {"t": {}},
        },
        'quantization_config.transform_config=["t"]',
    ),
    (
        {"quant_method": "compressed-tensors", "quantization_status": "frozen", "config_groups": {"g": CT_W4}},
        'quantization_config.quantization_status="frozen"',
    ),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, 'quantization_config.version="gemv"'),
    ({"quant_method": "awq", "bits": 4, "version": "exllama"}, 'quantization_config.version="exllama"'),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, "quantization_config.zero_point=false"),
    ({"quant_method": "gptq", "bits": 5, "group_size": 128}, "quantization_config.bits=5"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, 'checkpoint_format="marlin"'),
    ({"quant_method": "gptq", "bits": 4, "is_marlin_format": True}, 'checkpoint_format="marlin"'),
    (
        {"quant_method": "gptq", "bits": 4, "dynamic": {"+:.*mlp.*": {"bits": 5}}},
        "quantization_config.dynamic['+:.*mlp.*'].bits=5",
    ),
    ({"quant_method": "gptq", "bits": 4, "dynamic": {"+:(": {}}}, "quantization_config.dynamic['+:(']"),
    ({"quant_method": "gptq", "bits": 4, "dynamic": {".*": {"pack_dtype": "int8"}}}, '.pack_dtype="int8"'),
    ({"quant_method": "auto-round", "bits": 4, "packing_format": "auto_round:fp8"}, 'packing_format="auto_round:fp8"'),
    ({"quant_method": "auto-round", "bits": 4, "data_type": "nv_fp"}, 'quantization_config.data_type="nv_fp"'),
    ({"quant_method": "auto-round", "bits": 8, "packing_format": "auto_round:auto_awq"}, "quantization_config.bits=8"),
    (
        {"quant_method": "auto-round", "extra_config": {"m": {"bits": 6}}},
        "quantization_config.extra_config['m'].bits=6",
    ),
    (  # AutoRound's own older layers store zeros as they are, AutoGPTQ's minus one: the file does not say
        {"quant_method": "intel/auto-round", "bits": 4, "sym": False, "backend": "auto_round:exllamav2"},
        'quantization_config.backend="auto_round:exllamav2"',
    ),
    (
        {"quant_method": "auto-round", "packing_format": "auto_round:awq", "extra_config": {"m": {"group_size": -1}}},
        "quantization_config.extra_config['m'].group_size=-1",
    ),
    ({"quant_method": "fp8", "fmt": "e5m2"}, 'quantization_config.fmt="e5m2"'),
    ({"quant_method": "fp8", "scale_fmt": "ue8m0"}, 'quantization_config.scale_fmt="ue8m0"'),
    ({"group_size": 32, "bits": 4, "mode": "fp6"}, 'quantization_config.mode="fp6"'),
    ({"group_size": 64, "bits": 7}, "quantization_config.bits=7"),
]


@pytest.mark.parametrize("quant, key", REFUSED, ids=[k for _, k in REFUSED])
def test_unsupported_quantization_is_refused_in_one_line_naming_it(quant, key):
    with pytest.raises(UnsupportedModelError) as err:
        ModelConfig.from_hf({**BASE, "quantization_config": quant})
    message = str(err.value)
    assert key in message and "config.json" in message and "not implemented" in message and "supported:" in message
    assert "\n" not in message


def test_autoround_extra_config_entries_as_its_exports_write_them():
    """Exact module names first, then regex keys (newer exports' dynamic_config) by re.match; bits 16 is
    float; the activation keys AutoRound writes per module and null GGUF double-quantization keys pass."""
    lm_head = {"bits": 8, "data_type": "int", "group_size": 32, "sym": True, "act_bits": 16, "act_data_type": "float"}
    q = {
        "quant_method": "auto-round",
        "packing_format": "auto_round:auto_gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "extra_config": {
            "lm_head": {**lm_head, "act_group_size": 128, "act_sym": True, "super_bits": None},
            r".*mlp\.down_proj": {"bits": 8},
            "model.layers.0.mlp.down_proj": {"bits": 16, "data_type": "float"},
        },
    }
    scheme = parse_quant_scheme({"quantization_config": q})
    assert (scheme.method, scheme.checkpoint_format) == ("gptq", "gptq")
    assert scheme.mode_for("lm_head") == (8, 32)
    assert scheme.mode_for("model.layers.0.mlp.down_proj") is None  # the exact name wins over the regex
    assert scheme.mode_for("model.layers.1.mlp.down_proj") == (8, 128)
    assert scheme.mode_for("model.layers.1.mlp.up_proj") == (4, 128)
    awq = parse_quant_scheme({"quantization_config": {**q, "packing_format": "auto_round:awq", "extra_config": {}}})
    assert (awq.method, awq.checkpoint_format, awq.bits) == ("awq", "gemm", 4)
    with pytest.raises(UnsupportedModelError, match="super_bits=2"):
        parse_quant_scheme({"quantization_config": {**q, "extra_config": {"lm_head": {"super_bits": 2}}}})


def test_mlx_quantization_key_is_parsed_and_its_module_entries_checked():
    q = {"group_size": 64, "bits": 4, "lm_head": {"group_size": 32, "bits": 8}, "model.layers.0.mlp.up_proj": False}
    scheme = parse_quant_scheme({"quantization": q, "quantization_config": q})
    assert (scheme.method, scheme.bits, scheme.group_size) == ("mlx", 4, 64)
    assert scheme.mode_for("lm_head") == (8, 32) and scheme.mode_for("model.layers.0.mlp.up_proj") is None
    assert scheme.mode_for("model.layers.1.mlp.up_proj") == (4, 64)
    nv = parse_quant_scheme({"quantization": {**q, "lm_head": {"mode": "nvfp4", "group_size": 16, "bits": 4}}})
    assert nv.mlx_mode_for("lm_head") == "nvfp4" and nv.mlx_mode_for("model.norm") == "affine"
    bad = {"group_size": 64, "bits": 4, "lm_head": {"mode": "nvfp3", "group_size": 16, "bits": 4}}
    with pytest.raises(UnsupportedModelError, match=r'quantization\.lm_head\.mode="nvfp3"'):
        parse_quant_scheme({"quantization": bad})
    mixed = {"quantization": q, "quantization_config": {"quant_method": "awq"}}
    with pytest.raises(
        UnsupportedModelError, match=r"quant_method=\"awq\" in config.json is not implemented alongside MLX"
    ):
        parse_quant_scheme(mixed)


def test_compressed_tensors_act_order_reads_exactly_and_contiguous_g_idx_is_plain(folders):
    quant, ref = folders("ct_w4_act")
    scheme = parse_quant_scheme(json.loads((quant / "config.json").read_text()))
    tensors = load_tensors(quant / "model.safetensors")
    prefix = "model.layers.0.mlp.up_proj"
    module = {s: tensors[f"{prefix}.{s}"] for s in ("weight_packed", "weight_scale", "weight_shape", "weight_g_idx")}
    w = read_quantized_module(scheme, prefix, module)
    assert w.perm is not None
    np.testing.assert_allclose(w.dequantize(), load_tensors(ref / "model.safetensors")[f"{prefix}.weight"], atol=1e-6)
    contiguous = np.arange(128) // 32
    plain = read_quantized_module(scheme, prefix, {**module, "weight_g_idx": contiguous})
    assert plain.perm is None
    np.testing.assert_array_equal(plain.codes, w.codes[:, np.argsort(w.perm)])  # the same codes, in file order


def test_compressed_tensors_activation_scheme_is_kept_float_with_a_log_line(folders, caplog):
    import lantern.app.models.quant.compressed_tensors as ct

    for kind, said in (("ct_w8a8", "int8"), ("ct_w4a16", None)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=ct.__name__):
            parse_quant_scheme(json.loads((folders(kind)[0] / "config.json").read_text()))
        lines = [r.message for r in caplog.records if "activations" in r.message]
        assert lines == ([] if said is None else [lines[0]]) and (said is None or said in lines[0]), kind


def test_bitsandbytes_int8_in_a_tiled_gpu_layout_is_refused(folders):
    quant, _ = folders("bnb8")
    scheme = parse_quant_scheme(json.loads((quant / "config.json").read_text()))
    tensors = load_tensors(quant / "model.safetensors")
    prefix = "model.layers.0.mlp.up_proj"
    module = {"weight": tensors[f"{prefix}.weight"], "SCB": tensors[f"{prefix}.SCB"]}
    row = read_quantized_module(scheme, prefix, {**module, "weight_format": np.array(0, np.uint8)})
    np.testing.assert_array_equal(row.dequantize(), read_quantized_module(scheme, prefix, module).dequantize())
    with pytest.raises(UnsupportedModelError, match=r"up_proj\.weight_format=2: .*tiled GPU layout"):
        read_quantized_module(scheme, prefix, {**module, "weight_format": np.array(2, np.uint8)})


def test_compressed_tensors_fp8_block_structure_string_form_parses(folders):
    cfg = json.loads((folders("ct_fp8_block")[0] / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["block_structure"] = "128x64"
    assert parse_quant_scheme(cfg).weight_block_size == (128, 64)
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["block_structure"] = "128"
    with pytest.raises(UnsupportedModelError, match=r"block_structure=\"128\""):
        parse_quant_scheme(cfg)
