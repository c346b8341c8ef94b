"""Mixed-precision folders (ModelOpt MIXED_PRECISION, compressed-tensors mixed-precision): which scheme each
module is read with, the older hf_quant_config.json form, and storage that contradicts the config.

The folders themselves (every module read exactly, logits on both backends) are cases of
test_hf_quant_formats.py and test_quantized_folders.py.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from lantern.app.models.quant.hf_formats import parse_quant_scheme, quantized_module_names
from lantern.app.models.quant.mixed import module_scheme
from lantern.app.models.spec import UnsupportedModelError
from tests.models.test_hf_quant_formats import CT_W4, CT_W8, load_tensors, read_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("torch")  # the writers build the float model with transformers
    from tests.fixtures.hf_quant_writers import writer

    root = tmp_path_factory.mktemp("mixed")
    return functools.cache(lambda kind: writer(kind, root))


def test_compressed_tensors_groups_resolve_by_name_then_pattern_then_linear():
    """As vLLM resolves targets: an exact module name wins over a matching pattern, a pattern over the
    class-wide Linear; each group is read with its own format and scheme."""
    q = {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "config_groups": {
            "fp8": {
                **CT_W8,
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                "format": "float-quantized",
            },
            "int4": {**CT_W4, "targets": ["re:.*mlp\\.(gate|up)_proj$"], "format": "pack-quantized"},
            "int8": {**CT_W8, "targets": ["model.layers.3.mlp.up_proj"], "format": "pack-quantized"},
        },
    }
    scheme = parse_quant_scheme({"quantization_config": q})
    assert scheme.method == "mixed"
    of = lambda name: (module_scheme(scheme, name).method, module_scheme(scheme, name).bits)
    assert of("model.layers.3.mlp.up_proj") == ("ct-pack", 8)  # by name, though the pattern matches too
    assert of("model.layers.3.mlp.gate_proj") == ("ct-pack", 4)
    assert of("model.layers.0.self_attn.q_proj") == ("fp8", 8)  # every other Linear
    assert of("model.layers.0.mlp.down_proj") == ("fp8", 8)


def test_modelopt_mixed_lists_modules_exactly_and_leaves_the_rest_float():
    layers = {"model.layers.0.mlp.up_proj": {"quant_algo": "NVFP4", "group_size": 16}, "lm_head": {"quant_algo": "FP8"}}
    scheme = parse_quant_scheme(
        {
            "quantization_config": {
                "quant_method": "modelopt",
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": layers,
            }
        }
    )
    assert scheme.table.scheme_for("model.layers.0.mlp.up_proj").method == "modelopt-fp4"
    assert scheme.table.scheme_for("lm_head").method == "fp8"
    assert scheme.table.scheme_for("model.layers.0.mlp.gate_proj") is None  # unlisted: float
    assert scheme.table.scheme_for("model.layers.0.mlp.up_proj.x") is None  # names, not prefixes
    assert "ModelOpt mixed precision" in scheme.label and "NVFP4" in scheme.label


def test_mixed_folder_from_hf_quant_config_json_reads_the_same(folders, tmp_path):
    """Older ModelOpt exports keep MIXED_PRECISION and its quantized_layers in hf_quant_config.json."""
    import shutil

    quant, _ = folders("modelopt_mixed")
    legacy = tmp_path / "legacy"
    shutil.copytree(quant, legacy)
    cfg = json.loads((legacy / "config.json").read_text())
    q = cfg.pop("quantization_config")
    side = {"quant_algo": q["quant_algo"], "quantized_layers": q["quantized_layers"], "kv_cache_quant_algo": "FP8"}
    (legacy / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": side}))
    (legacy / "config.json").write_text(json.dumps(cfg))
    _, _, modules, weights = read_folder(quant)
    _, _, legacy_modules, legacy_weights = read_folder(legacy)
    assert legacy_modules == modules and len(modules) == 13
    for prefix, w in weights.items():
        assert type(legacy_weights[prefix]) is type(w) and legacy_weights[prefix].source == w.source, prefix


def test_mixed_folder_whose_storage_contradicts_its_config_is_named(folders):
    quant, _ = folders("modelopt_mixed")
    cfg = json.loads((quant / "config.json").read_text())
    tensors = load_tensors(quant / "model.safetensors")
    layers = cfg["quantization_config"]["quantized_layers"]

    def names_with(changed: dict) -> dict:
        q = {**cfg["quantization_config"], "quantized_layers": changed}
        return quantized_module_names(parse_quant_scheme({"quantization_config": q}), tensors)

    dropped = {k: v for k, v in layers.items() if k != "model.layers.0.mlp.gate_proj"}
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.mlp\.gate_proj\.weight_scale.* keeps model\.layers\.0\.mlp\.gate_proj in float",
    ):
        names_with(dropped)
    # an FP8 module (weight, weight_scale, input_scale) said to be NVFP4 (which needs weight_scale_2)
    relabelled = {**layers, "model.layers.0.self_attn.q_proj": {"quant_algo": "NVFP4", "group_size": 16}}
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj is ModelOpt NVFP4 in the config"):
        names_with(relabelled)


def test_compressed_tensors_overlapping_targets_resolve_as_the_library_does():
    """Which group a module belongs to is what compressed-tensors' own match_targets says (exact names,
    then patterns in the order of their strings, then Linear; a target in two groups: the later one)."""
    import torch
    from compressed_tensors.utils.match import match_targets

    fp8 = {"num_bits": 8, "type": "float", "strategy": "channel"}
    groups = {
        "a": {**CT_W4, "targets": ["re:.*mlp.*", "model.layers.2.self_attn.o_proj"], "format": "pack-quantized"},
        "b": {**CT_W8, "targets": ["re:.*layers\\.0\\..*", "Linear"], "format": "pack-quantized"},
        "c": {**CT_W8, "weights": fp8, "targets": ["Linear", "re:.*o_proj"], "format": "float-quantized"},
    }
    q = {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": groups}
    scheme = parse_quant_scheme({"quantization_config": q})
    owner = {t: name for name, g in groups.items() for t in g["targets"]}  # later groups overwrite
    kinds = {"a": ("ct-pack", 4), "b": ("ct-pack", 8), "c": ("fp8", 8)}
    names = [
        f"model.layers.{i}.{m}" for i in range(3) for m in ("mlp.down_proj", "self_attn.o_proj", "self_attn.q_proj")
    ]
    for name in names:
        picked = owner[match_targets(name, torch.nn.Linear(1, 1), list(owner))[0]]
        ours = module_scheme(scheme, name)
        assert (ours.method, ours.bits) == kinds[picked], name


def test_compressed_tensors_pattern_that_is_no_regex_is_refused_by_name():
    groups = {"a": CT_W4, "b": {**CT_W8, "targets": ["re:.*mlp.("]}}
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": groups}
    with pytest.raises(
        UnsupportedModelError, match=r'config_groups\.b\.targets="re:\.\*mlp\.\(".*not a regular expression'
    ):
        parse_quant_scheme({"quantization_config": q})


def test_modelopt_names_match_either_spelling_of_a_multimodal_prefix():
    layers = {"model.language_model.layers.0.mlp.up_proj": {"quant_algo": "FP8"}, "lm_head": {"quant_algo": "FP8"}}
    q = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}
    table = parse_quant_scheme({"quantization_config": q}).table
    assert table.scheme_for("language_model.model.layers.0.mlp.up_proj").method == "fp8"
    assert table.scheme_for("model.language_model.layers.0.mlp.up_proj").method == "fp8"
    assert table.scheme_for("language_model.lm_head").method == "fp8"
    assert table.scheme_for("language_model.model.layers.0.mlp.gate_proj") is None


def test_mixed_config_json_without_its_map_takes_it_from_hf_quant_config_json(folders, tmp_path):
    """Older converters wrote MIXED_PRECISION into config.json and left quantized_layers in the side file."""
    import shutil

    quant, _ = folders("modelopt_mixed")
    folder = tmp_path / "split"
    shutil.copytree(quant, folder)
    cfg = json.loads((folder / "config.json").read_text())
    layers = cfg["quantization_config"].pop("quantized_layers")
    (folder / "config.json").write_text(json.dumps(cfg))
    side = {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers}
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": side}))
    assert read_folder(folder)[2] == read_folder(quant)[2]
    (folder / "hf_quant_config.json").unlink()
    with pytest.raises(UnsupportedModelError, match="without a quantized_layers map"):
        read_folder(folder)


def test_an_int8_weight_is_not_read_as_fp8():
    """A module whose scheme says FP8 but whose weight holds int8 codes (a misattributed module) is an error."""
    from lantern.app.models.quant.hf_formats import QuantScheme, read_quantized_module

    tensors = {"weight": np.ones((4, 32), np.int8), "weight_scale": np.ones((4, 1), np.float32)}
    with pytest.raises(ValueError, match=r"m\.weight is int8"):
        read_quantized_module(QuantScheme("fp8", 8, 0), "m", tensors)
