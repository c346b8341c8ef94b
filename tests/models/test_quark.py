"""AMD Quark folders (quant_method "quark"), written as Quark's exporter lays them out (tests/fixtures/quark_writer.py):
every quantized module reads exactly to the values it stores (FP8 tensor / channel / block, int8, int4 and uint4
groups in both pack orders, MXFP4, MXFP8, NVFP4), stays quantized, and the served model's logits equal transformers'
on those values on both backends; per-layer configs and excludes resolve as vLLM resolves them; what Lantern does not
compute is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
from lantern.app.models.quant.hf_formats import parse_quant_scheme
from lantern.app.models.quant.microscaled import MxWeight
from tests.fixtures.quark_writer import KINDS, quark_config, quark_folder

# kind -> the form its modules are held in (kept quantized)
_FORM = {k: Fp8Weight for k in ("fp8_tensor", "fp8_channel", "fp8_block")}
_FORM |= {k: AffineWeight for k in ("int8_channel", "int4_g32", "uint4_g32_order")}
_FORM |= {k: MxWeight for k in ("mxfp4", "mxfp8", "nvfp4")}


@pytest.fixture(scope="module")
def folders(tiny_model_dir, tmp_path_factory):
    made: dict[str, tuple[Path, Path]] = {}
    root = tmp_path_factory.mktemp("quark")

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in made:
            made[kind] = quark_folder(Path(tiny_model_dir("llama2")), root, kind)
        return made[kind]

    return get


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_module_reads_exactly_to_the_values_it_stores(folders, kind):
    from tests.models.test_hf_quant_formats import load_tensors, read_folder

    quant, ref = folders(kind)
    scheme, _, modules, weights = read_folder(quant)
    reference = load_tensors(ref / "model.safetensors")
    assert scheme.method == "mixed" and len(modules) == 7 * 2  # q, k, v, o, gate, up, down of 2 layers; lm_head float
    for prefix, w in weights.items():
        assert isinstance(w, _FORM[kind]), prefix
        got = w.portable().dequantize() if isinstance(w, MxWeight) else w.dequantize()
        np.testing.assert_allclose(got, reference[f"{prefix}.weight"], rtol=1e-6, atol=1e-7, err_msg=prefix)


def _converted(backend: str, kind: str) -> tuple[int, int, bool] | None:
    """The mode a backend converts this kind's modules to where it has no exact layout for them (as
    tests/models/test_quantized_folders.py states them for the same storage of the other formats); None: exact."""
    from tests.models.quant_logits import torch_cpu_vnni
    from tests.models.test_quantized_folders import FP8_TORCH, PER_CHANNEL_INT8

    vnni = torch_cpu_vnni()
    if backend == "mlx":
        return (8, 32, False) if kind.startswith("fp8") else None
    if kind.startswith("fp8") or kind == "mxfp8":
        return FP8_TORCH[vnni]
    if kind == "nvfp4":
        return (8, 32, False) if vnni else PER_CHANNEL_INT8
    return PER_CHANNEL_INT8 if kind == "mxfp4" and not vnni else None


@pytest.mark.parametrize("kind", list(KINDS))
def test_served_logits_match_transformers_on_what_the_backend_holds(folders, backend, kind, tmp_path, caplog):
    """transformers on the stored values, where a backend converts a module (no FP8 matmul on MLX or a CPU, ...)
    on the same round-to-nearest conversion; the log says whether it converted."""
    import logging

    from lantern.app.models.quant.affine import quantize_affine
    from tests.models.quant_logits import logits_error, reference_folder, tolerance

    quant, ref = folders(kind)
    mode = _converted(backend, kind)

    def held(name, w):
        if mode is None or w.ndim != 2 or "proj" not in name:
            return w
        bits, group, symmetric = mode
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    held_ref = reference_folder(ref, tmp_path / "held", held)
    with caplog.at_level(logging.INFO):
        err = logits_error(str(quant), str(held_ref), backend)
    assert err <= tolerance(backend, str(held_ref)), f"{backend} {kind}: logits differ by {err:.4f} of their spread"
    converted = [line for line in caplog.text.splitlines() if "relative error" in line]
    assert bool(converted) == (mode is not None), caplog.text


def test_layer_configs_and_excludes_resolve_as_vllm_resolves_them(tiny_model_dir, tmp_path):
    """Excludes first (exact names, `re:` patterns, globs), then layer_quant_config (globs, exact names), then the
    global config: MLP projections in FP8, layer 1's attention output in float, the rest int4."""
    from tests.models.test_hf_quant_formats import read_folder

    config = quark_config(KINDS["int4_g32"][0], "reorder")
    config["layer_quant_config"] = {"*mlp*": {"weight": KINDS["fp8_channel"][0]}}
    config["exclude"] = ["lm_head", r"re:model\.layers\.1\.self_attn\.o_proj$", "*layers.0.mlp.down_proj"]
    quant, _ = quark_folder(Path(tiny_model_dir("llama2")), tmp_path, "int4_g32", config)
    _, _, modules, weights = read_folder(quant)
    assert "model.layers.1.self_attn.o_proj" not in modules and "model.layers.0.mlp.down_proj" not in modules
    assert isinstance(weights["model.layers.0.mlp.up_proj"], Fp8Weight)
    assert isinstance(weights["model.layers.1.self_attn.q_proj"], AffineWeight)
    assert len(modules) == 7 * 2 - 2


def _config(**changes) -> dict:
    q = quark_config(KINDS["fp8_channel"][0], "reorder")
    for key, value in changes.items():
        q[key] = value
    return {"quantization_config": q}


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"export": {"weight_format": "fake_quantized"}}, "export.weight_format"),
        ({"algo_config": [{"name": "rotation", "r4": True}]}, "algo_config[0].r4"),
        ({"algo_config": [{"name": "quarot"}]}, "algo_config[0].r3"),
        (
            {"global_quant_config": {"weight": {"dtype": "fp6_e3m2", "qscheme": "per_group", "group_size": 32}}},
            "weight",
        ),
        (
            {"global_quant_config": {"weight": KINDS["fp8_channel"][0], "output_tensors": {"dtype": "fp8_e4m3"}}},
            "output",
        ),
        ({"global_quant_config": {"weight": {**KINDS["int8_channel"][0], "symmetric": False}}}, "symmetric"),
        ({"global_quant_config": {"weight": None}}, "global_quant_config"),
        ({"layer_type_quant_config": {"Linear": {"weight": KINDS["int4_g32"][0]}}}, "layer_type_quant_config"),
    ],
)
def test_what_it_does_not_compute_is_refused_by_name(changes, key):
    with pytest.raises(UnsupportedModelError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse_quant_scheme(_config(**changes))


def test_offline_rotations_and_kv_cache_scales_are_accepted(tiny_model_dir, tmp_path):
    """An offline rotation is folded into the weights (nothing to undo); FP8-KV exports' k_proj / v_proj output
    scales are not applied (the KV cache keeps the model's dtype) and skipped by the weight stream."""
    import torch
    from safetensors.torch import load_file, save_file

    from lantern.app.engine import LLM, SamplingParams

    rotation = [{"name": "rotation", "r1": True, "r2": True, "online_r1_rotation": False}]
    quarot = [{"name": "quarot", "r1": True, "r2": True, "r3": False, "r4": False}]  # (offline only: folded in)
    assert parse_quant_scheme(_config(algo_config=quarot)).method == "mixed"
    config = quark_config(KINDS["fp8_tensor"][0], "reorder", algo_config=rotation)
    kv = {"weight": KINDS["fp8_tensor"][0], "output_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}}
    config["layer_quant_config"] = {"*k_proj": kv, "*v_proj": kv}
    config["export"]["kv_cache_group"] = ["*k_proj", "*v_proj"]
    quant, _ = quark_folder(Path(tiny_model_dir("llama2")), tmp_path, "fp8_tensor", config)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def greedy() -> list[int]:
        llm = LLM(str(quant), dtype="float32", num_kv_blocks=16)
        try:
            return llm.generate(["Lantern serves"], params)[0].outputs[0].token_ids
        finally:
            llm.engine.shutdown()

    without = greedy()
    tensors = load_file(str(quant / "model.safetensors"))
    for i in range(2):
        for proj in ("k_proj", "v_proj"):
            tensors[f"model.layers.{i}.self_attn.{proj}.output_scale"] = torch.tensor(0.05)
    save_file(tensors, str(quant / "model.safetensors"), metadata={"format": "pt"})
    assert greedy() == without  # (skipped: neither refused as an unexpected tensor nor applied)


@pytest.mark.parametrize("kind", ["int4_g32", "mxfp4"])
def test_a_mixture_of_experts_keeps_each_expert_quantized(tiny_model_dir, tmp_path, backend, kind):
    """Quark exports a MoE's experts one by one (experts.N.gate_proj, ...); amd's configs keep the routers float
    (exclude `re:.*mlp.gate$`): the experts stack quantized, logits equal transformers' on the stored values."""
    from tests.models.quant_logits import logits_error, tolerance

    config = quark_config(*KINDS[kind])
    config["exclude"] = ["lm_head", "re:.*mlp.gate$"]
    quant, ref = quark_folder(Path(tiny_model_dir("qwen3_moe")), tmp_path, kind, config)
    err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend} {kind}: logits differ by {err:.4f} of their spread"
