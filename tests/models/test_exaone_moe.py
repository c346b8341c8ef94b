"""K-EXAONE (exaone_moe): config.json read as ExaoneMoeConfig / ExaoneMoeForCausalLM read it, refusals naming the
key. (Its `mtp.*` module left unread: test_mellum.py. Logits and greedy tokens on both backends: the "exaone_moe"
variant in tests/conformance; an mlx_lm 4-bit folder: test_mlx_moe_folders.py.)"""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.models.test_config_support import BASE

KEXAONE = {**BASE, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def test_config_means_what_transformers_builds():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {**KEXAONE, "sliding_window": 16, "sliding_window_pattern": 2, "n_group": 2, "topk_group": 1}
    ours = ModelConfig.from_hf({"model_type": "exaone_moe", **keys})
    ref = AutoConfig.for_model("exaone_moe", **keys)
    model = AutoModelForCausalLM.from_config(ref, dtype=torch.float32).model
    for i, layer in enumerate(model.layers):
        sliding = ref.layer_types[i] == "sliding_attention"
        assert ours.layer_windows[i] == (16 if sliding else None)
        assert ours.rope_layers[i] == sliding  # the global layers are NoPE
        assert ours.moe.is_sparse(i) == hasattr(layer.mlp, "experts")
    gate = model.layers[1].mlp.gate
    assert (ours.moe.n_group, ours.moe.topk_group, ours.moe.top_k) == (gate.num_group, gate.topk_group, gate.top_k)
    assert ours.moe.routed_scaling_factor == gate.routed_scaling_factor
    assert ours.moe.shared_size == model.layers[1].mlp.shared_experts.down_proj.in_features
    assert ours.qk_norm and ours.family == "llama_moe"


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
        ({"n_group": 3}, "n_group"),  # 8 experts do not split in 3
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"is_moe_layer": [True] * 4}, "is_moe_layer"),  # layer 0 is dense (first_k_dense_replace 1)
        ({"scoring_func": "softmax"}, "scoring_func"),  # (mlx_lm reads these; ExaoneMoeConfig's router is V3's)
        ({"topk_method": "greedy"}, "topk_method"),
        ({"sliding_window_pattern": "LLG", "num_hidden_layers": 4}, "sliding_window_pattern"),  # the last would slide
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "exaone_moe", **KEXAONE, **extra})


def test_released_is_moe_layer_may_count_the_prediction_layer():
    stated = {**KEXAONE, "is_moe_layer": [False, True, True, True, True]}  # (a fifth entry: the mtp layer's)
    assert ModelConfig.from_hf({"model_type": "exaone_moe", **stated}).moe.is_sparse(3)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_gguf_answers_as_transformers(tmp_path, monkeypatch, backend):
    """An exaone-moe GGUF (llama.cpp's ExaoneMoEModel) with a prediction layer after the stack computes what
    transformers computes on its checkpoint: the window pattern, NoPE full layers, the grouped sigmoid router."""
    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.gguf_exaone_moe import convert_exaone_moe
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import build_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, ref = convert_exaone_moe(build_model("exaone_moe", tmp_path / "hf"), tmp_path, nextn=1)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.architecture == "exaone_moe" and cfg.moe.n_group == 2 and any(cfg.layer_windows or [])
    assert_matches_reference(llm, hf_model(ref), PROMPT)


def test_gguf_sliding_base_llama_cpp_does_not_turn_is_refused(tmp_path, monkeypatch):
    """llama.cpp's exaone-moe graph turns the sliding layers with freq_base: a different rope.freq_base_swa is
    refused by name rather than read."""
    import gguf

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.spec import UnsupportedModelError
    from tests.fixtures.gguf_exaone_moe import convert_exaone_moe
    from tests.fixtures.gguf_writer import rewrite_with
    from tests.fixtures.tiny_models import build_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, _ = convert_exaone_moe(build_model("exaone_moe", tmp_path / "hf"), tmp_path)
    bad = rewrite_with(path, {"exaone-moe.rope.freq_base_swa": (5e5, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(UnsupportedModelError, match="freq_base_swa"):
        resolve_model(str(bad))
