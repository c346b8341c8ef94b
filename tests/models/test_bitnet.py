"""BitNet b1.58: the `bitnet` family (subln norms, a relu^2-gated MLP) read as transformers' BitNetConfig reads
it, and `quant_method: "bitnet"` folders (packed ternary weights, or the float masters ternarized at load) kept
2-bit on both backends with the 8-bit per-token activations the models were trained with. The reference is
transformers loading the same folder (its BitNet quantizer's BitLinear / AutoBitLinear), through the paged
cache; the weights' reading is checked against transformers' own unpacking and ternarization."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.bitnet import ACT_BITS, parse, read, unpack_ternary
from lantern.app.models.quant.hf_formats import parse_quant_scheme
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.bitnet_folders import LAYOUTS, bitnet_folder
from tests.models.quant_logits import logits_error, tolerance

BASE = {
    "model_type": "bitnet",
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.fixture(autouse=True)
def _eager_reference(monkeypatch):
    """transformers' BitLinear helpers are torch.compile'd: eager here, the same maths without compiling."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "disable", True)


def test_config_matches_transformers():
    from transformers import BitNetConfig

    cfg, ref = ModelConfig.from_hf(dict(BASE)), BitNetConfig(**BASE)
    assert cfg.sub_norms and cfg.hidden_act == ref.hidden_act == "relu2" and cfg.family == "llama"
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps, cfg.max_position_embeddings) == (
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.rms_norm_eps,
        ref.max_position_embeddings,
    )
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"] == 500000.0
    assert cfg.quantization is None  # no quantization_config: a float model, as transformers runs it


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"quantization_config": {"quant_method": "bitnet", "linear_class": "ternary"}}, "linear_class"),
        ({"quantization_config": {"quant_method": "bitnet", "quantization_mode": "online"}}, "quantization_mode"),
        ({"quantization_config": {"quant_method": "bitnet", "use_rms_norm": True}}, "use_rms_norm"),
        ({"model_type": "llama", "architectures": ["BitnetForCausalLM"]}, "architectures"),  # (1bitLLM's remote code)
        ({"architectures": ["BitnetForCausalLM"]}, "architectures"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, **extra})


def test_unpacking_is_transformers_unpacking():
    import torch
    from transformers.integrations.bitnet import unpack_weights

    packed = np.random.default_rng(0).integers(0, 256, size=(12, 40), dtype=np.uint8)
    want = unpack_weights(torch.from_numpy(packed), dtype=torch.float32).numpy()
    np.testing.assert_array_equal(unpack_ternary(packed).astype(np.float32) - 1, want)


@pytest.mark.parametrize("layout", ["bitlinear", "autobitlinear", "online"])
def test_each_layout_reads_to_the_weights_transformers_multiplies(layout):
    """The stored module as 2-bit codes whose values are what transformers' layer multiplies x by."""
    import torch
    from transformers.integrations.bitnet import WeightQuant, pack_weights

    rng = np.random.default_rng(1)
    master = torch.from_numpy(rng.normal(size=(16, 64)).astype(np.float32))
    scheme = parse(LAYOUTS[layout])
    if layout == "online":
        weight = read(scheme, "p", {"weight": master.numpy()})
        want = WeightQuant.forward(None, master).numpy()
    else:
        scale = master.abs().mean()
        ternary = (master / scale).round().clamp(-1, 1)
        stored = 1.0 / scale if layout == "bitlinear" else scale
        packed = pack_weights(ternary.to(torch.int8).clone()).numpy()
        weight = read(scheme, "p", {"weight": packed, "weight_scale": stored.reshape(1).numpy()})
        # BitLinear divides its output by weight_scale; AutoBitLinear multiplies it
        want = (ternary / stored if layout == "bitlinear" else ternary * stored).numpy()
    assert isinstance(weight, AffineWeight) and weight.bits == 2 and weight.act_bits == ACT_BITS
    assert int(weight.codes.max()) <= 2
    np.testing.assert_allclose(weight.dequantize(), want, rtol=1e-6, atol=0)


def test_offline_autobitlinear_float_weights_must_be_ternary():
    scheme = parse(LAYOUTS["autobitlinear"])
    ternary = np.array([[-1.0, 0.0, 1.0, 1.0]], np.float32)
    weight = read(scheme, "p", {"weight": ternary, "weight_scale": np.array([0.5], np.float32)})
    np.testing.assert_array_equal(weight.dequantize(), ternary * 0.5)
    with pytest.raises(ValueError, match="other than -1, 0, 1"):
        read(scheme, "p", {"weight": ternary * 0.7, "weight_scale": np.array([0.5], np.float32)})


def test_activation_quantization_is_transformers_on_both_backends():
    """Each backend's per-token 8-bit grid is transformers' ActQuant (AutoBitLinear's) on the same rows."""
    import mlx.core as mx
    import torch
    from transformers.integrations.bitnet import ActQuant

    from lantern.backends.mlx.quant import quantize_rows as mlx_rows
    from lantern.backends.torch.quant_layer import quantize_rows as torch_rows

    x = torch.from_numpy(np.random.default_rng(2).normal(size=(5, 96)).astype(np.float32) * 3)
    want = ActQuant.forward(None, x).numpy()
    np.testing.assert_array_equal(torch_rows(x, 127.0).numpy(), want)
    np.testing.assert_allclose(np.array(mlx_rows(mx.array(x.numpy()), 127.0)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("layout", "model_type"),
    [("bitlinear", "bitnet"), ("autobitlinear", "bitnet"), ("online", "bitnet"), ("bitlinear", "llama")],
)
def test_logits_match_transformers_bitlinear_through_the_paged_cache(tmp_path, backend, layout, model_type):
    folder = bitnet_folder(tmp_path / f"{model_type}-{layout}", layout, model_type)
    err = logits_error(str(folder), str(folder), backend)
    assert err < tolerance(backend, str(folder)), (layout, model_type, err)


def test_ternary_weights_stay_two_bit_with_quantized_inputs(tmp_path, backend):
    from lantern.app.engine import LLM

    folder = bitnet_folder(tmp_path / "bitnet", "bitlinear")
    llm = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=16)
    try:
        attn = llm.engine.backend.model.model.layers[0].self_attn
        if backend == "mlx":
            from lantern.backends.mlx.quant import InputQuantizedLinear

            assert isinstance(attn.q_proj, InputQuantizedLinear) and attn.q_proj.bits == 2
        else:
            from lantern.backends.torch.quant_layer import QuantizedInput

            assert isinstance(attn.qkv_proj, QuantizedInput) and attn.qkv_proj.levels == 127.0
        assert parse_quant_scheme({"quantization_config": LAYOUTS["bitlinear"]}).label.startswith("BitNet ternary")
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("qtype", ["F32", "TQ2_0", "TQ1_0"])
def test_gguf_computes_the_values_it_holds(tmp_path, backend, qtype):
    """llama.cpp's bitnet GGUFs (float, or ternary TQ blocks held as 2-bit codes): transformers on the same values."""
    from tests.fixtures.gguf_bitnet import bitnet_gguf

    path, folder = bitnet_gguf(tmp_path, qtype)
    err = logits_error(str(path), str(folder), backend)
    assert err < tolerance(backend, str(folder)), (qtype, err)


def test_gguf_with_per_projection_scales_is_refused(tmp_path):
    from lantern.app.models.gguf_config import hf_config_from_gguf
    from lantern.app.models.gguf_names import read_gguf_index
    from tests.fixtures.gguf_bitnet import bitnet_gguf

    path, _ = bitnet_gguf(tmp_path, "F32")
    index = read_gguf_index(str(path))
    tensors = {t.name: t for t in index.tensors}
    assert hf_config_from_gguf(index.metadata, tensors, path.name)["model_type"] == "bitnet"
    tensors["blk.0.attn_q.scale"] = tensors["output_norm.weight"]  # (bitnet.cpp's layout names one per projection)
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q\.scale"):
        hf_config_from_gguf(index.metadata, tensors, path.name)


def test_tensor_parallelism_is_refused_for_bitnet_activations():
    """Each rank would take max|x| over its own columns of o_proj's / down_proj's input: refused by name."""
    from lantern.backends.torch.parallel import local_config

    cfg = ModelConfig.from_hf({**BASE, "model_type": "llama", "quantization_config": LAYOUTS["bitlinear"]})
    with pytest.raises(ValueError, match="activation quantization"):
        local_config(cfg, 2)
