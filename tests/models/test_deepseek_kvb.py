"""DeepSeek's kv_b_proj stays float under --isq q4 / q8, a quantized one (an old GGUF whose
attn_kv_b is whole and Q8_0) is made dense once while loading, and an FP8 one (DeepSeek-V3's release
layout) is taken with the file's e4m3 values exactly, on both backends: afterwards no
quantized kv_b layer is left, the weight bytes the backend counted at load (which size the KV cache)
are every tensor the model holds, the dense one included, nothing is built in the forward, and the
logits still match transformers on the dequantized weights to the quantized tests' tolerance
(tests/models/quant_logits.py).

Ranks of 32 (kv_lora_rank, q_lora_rank, qk_nope_head_dim): kv_b_proj's 32 columns are whole groups
of every --isq layout and whole Q8_0 blocks, so its staying float is --isq's choice, not its width."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.quant.affine import quantize_affine
from tests.conformance.test_parity import PROMPT
from tests.fixtures.gguf_families import convert_to_gguf
from tests.fixtures.tiny_models import build_model
from tests.models.quant_logits import logits_error, reference_folder, tolerance
from tests.models.test_isq import isq_reference

WIDE = {"kv_lora_rank": 32, "q_lora_rank": 32, "qk_nope_head_dim": 32}
KV_B = "model.layers.{}.self_attn.kv_b_proj.weight"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))  # the GGUF tokenizer cache: per test


@pytest.fixture(scope="module")
def wide_kv_b(tmp_path_factory) -> Path:
    return build_model("deepseek_v3", tmp_path_factory.mktemp("deepseek-kvb") / "hf", **WIDE)


@pytest.fixture(scope="module")
def legacy_q8(tmp_path_factory) -> tuple[Path, Path]:
    """(the Q8_0 file with attn_kv_b whole, as converters before the k_b / v_b split wrote it;
    the HF folder of the values it holds). kv_lora_rank 64: each kv_b_proj row is two Q8_0 blocks
    with their own scales, which one int8 scale per row (torch's int8 layout) cannot hold exactly."""
    hf = build_model("deepseek_v3", tmp_path_factory.mktemp("deepseek-kvb64") / "hf", **{**WIDE, "kv_lora_rank": 64})
    path, ref = convert_to_gguf(hf, tmp_path_factory.mktemp("deepseek-kvb-q8"), "q8_0", legacy_mla=True)
    types = json.loads((ref / "gguf_types.json").read_text())
    assert types[KV_B.format(1)] == "Q8_0"  # stored in blocks: the path under test
    return path, ref


def _dense_kv_b(engine, backend: str, layer: int) -> np.ndarray:
    """Layer `layer`'s kv_b_proj as the model holds it, after checking it is a plain float Linear."""
    attn = engine.backend.model.model.layers[layer].self_attn
    if backend == "torch":
        import torch
        from torch import nn

        assert type(attn.kv_b_proj) is nn.Linear, type(attn.kv_b_proj)  # no quantized layer left
        assert attn.kv_b_proj.weight.dtype == torch.float32  # the model dtype
        assert attn.kv_b_weight().data_ptr() == attn.kv_b_proj.weight.data_ptr()  # the forward reads it, no copy
        return attn.kv_b_proj.weight.detach().cpu().numpy()
    import mlx.core as mx
    import mlx.nn as mnn

    assert type(attn.kv_b_proj) is mnn.Linear and "scales" not in attn.kv_b_proj, type(attn.kv_b_proj)
    assert attn.kv_b_proj.weight.dtype == mx.float32
    return np.array(attn.kv_b_proj.weight)


def _held_bytes(model, backend: str) -> int:
    """Bytes of every parameter and buffer (each tensor once), and a check that no tensor is held
    outside them (the old lazily built dense copy sat in a plain attribute, uncounted)."""
    if backend == "torch":
        import torch

        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        for module in model.modules():
            for name, value in vars(module).items():
                if name in ("_parameters", "_buffers", "_modules"):
                    continue
                inner = vars(value).values() if hasattr(value, "__dict__") else ()
                assert not any(isinstance(v, torch.Tensor) for v in (value, *inner)), f"{type(module)}.{name}"
        return sum(t.numel() * t.element_size() for t in tensors.values())
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for _, module in model.named_modules():
        for name, value in vars(module).items():
            inner = vars(value).values() if hasattr(value, "__dict__") else ()
            assert not any(isinstance(v, mx.array) for v in (value, *inner)), f"{type(module)}.{name}"
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def _check_held_once(model_path: str, backend: str, reference: Path, **options) -> None:
    """(1) dense kv_b_proj with the reference's values, (2) counted bytes = held bytes, before and
    after a generation (nothing is built in the forward)."""
    llm = LLM(model_path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=32, **options)
    try:
        engine = llm.engine
        ref = load_file(str(reference / "model.safetensors"))
        for layer in range(engine.model_config.num_layers):
            dense, want = _dense_kv_b(engine, backend, layer), ref[KV_B.format(layer)]
            np.testing.assert_allclose(dense, want, rtol=0, atol=1e-6, err_msg=f"layer {layer}")
        model = engine.backend.model
        assert engine.weight_bytes == _held_bytes(model, backend)
        llm.generate([llm.tokenizer.encode(PROMPT)], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert engine.weight_bytes == _held_bytes(model, backend)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_keeps_kv_b_float_counted_and_matches(wide_kv_b, tmp_path, backend, scheme):
    """--isq leaves kv_b_proj float (app/models/isq.py: made dense anyway, quantizing would add only
    its error) though its 32 columns would fit every layout; the other matrices are quantized."""
    ref = reference_folder(wide_kv_b, tmp_path / "ref", isq_reference(backend, scheme))
    floats = load_file(str(wide_kv_b / "model.safetensors"))
    held = load_file(str(ref / "model.safetensors"))
    assert np.array_equal(floats[KV_B.format(1)], held[KV_B.format(1)])
    o_proj = "model.layers.1.self_attn.o_proj.weight"
    assert np.abs(floats[o_proj] - held[o_proj]).max() > 1e-3  # the rest of the reference is quantized
    _check_held_once(str(wide_kv_b), backend, ref, quantization=scheme)
    err = logits_error(str(wide_kv_b), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {scheme}: logits differ by {err:.4f} of their spread"


def test_legacy_q8_0_attn_kv_b_is_dense_counted_and_matches(legacy_q8, tmp_path, backend):
    """MLX holds Q8_0 exactly; torch requantizes it to int8 per channel (as in
    test_gguf_families' Q8_0 test), so its reference holds that, except for kv_b_proj, which both
    backends take exactly (it is made dense)."""
    path, ref = legacy_q8
    types = json.loads((ref / "gguf_types.json").read_text())

    def held(name: str, w: np.ndarray) -> np.ndarray:
        if backend == "mlx" or types.get(name) != "Q8_0" or name.endswith("kv_b_proj.weight"):
            return w
        return quantize_affine(w.astype(np.float32), 8, w.shape[1], symmetric=True).dequantize()

    kv_b = load_file(str(ref / "model.safetensors"))[KV_B.format(1)]
    per_row = quantize_affine(kv_b.astype(np.float32), 8, kv_b.shape[1], symmetric=True).dequantize()
    assert np.abs(per_row - kv_b).max() > 1e-4  # an int8 layout would not hold the file's values
    reference = reference_folder(ref, tmp_path / "held", held)
    _check_held_once(str(path), backend, reference)
    err = logits_error(str(path), str(reference), backend)
    assert err <= tolerance(backend, str(reference)), f"{backend}: {err:.4f}"


@pytest.fixture(scope="module")
def fp8_folder(wide_kv_b, tmp_path_factory) -> tuple[Path, Path]:
    """(DeepSeek-V3's FP8 release layout: every projection e4m3 in 128 x 128 blocks with
    `weight_scale_inv`, the routers, embeddings, norms and head float; the folder of the values it holds)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from tests.fixtures.hf_quant_writers import quantize_fp8

    out = tmp_path_factory.mktemp("deepseek-fp8")
    quant, ref = out / "fp8", out / "ref"
    for folder in (quant, ref):
        shutil.copytree(wide_kv_b, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    stored, values = {}, {}
    for name, w in load_file(str(wide_kv_b / "model.safetensors")).items():
        if name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"):
            parts, values[name] = quantize_fp8(w, {"block": (128, 128)}, None, name)
            stored.update({f"{name.removesuffix('.weight')}.{k}": v for k, v in parts.items()})
        else:
            stored[name] = values[name] = w
    save_file(
        {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for k, v in stored.items()},
        str(quant / "model.safetensors"),
    )
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()}, str(ref / "model.safetensors"))
    cfg = json.loads((quant / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    (quant / "config.json").write_text(json.dumps(cfg))
    return quant, ref


def test_fp8_kv_b_is_taken_exactly_and_the_rest_requantized(fp8_folder, tmp_path, backend):
    """Neither backend has an FP8 matmul here: FP8 projections become 8-bit codes (MLX and the VNNI
    layers g32, aten's int8pack per channel), but kv_b_proj, made dense, takes the file's e4m3 values
    exactly (requantizing it first would only add error)."""
    from tests.models.quant_logits import torch_cpu_vnni

    quant, ref = fp8_folder
    per_channel = backend == "torch" and not torch_cpu_vnni()

    def held(name: str, w: np.ndarray) -> np.ndarray:
        if name.endswith("kv_b_proj.weight") or not name.endswith(("proj.weight", "proj_with_mqa.weight")):
            return w
        return quantize_affine(
            w.astype(np.float32), 8, w.shape[1] if per_channel else 32, symmetric=per_channel
        ).dequantize()

    reference = reference_folder(ref, tmp_path / "held", held)
    _check_held_once(str(quant), backend, reference)
    err = logits_error(str(quant), str(reference), backend)
    assert err <= tolerance(backend, str(reference)), f"{backend}: {err:.4f}"
