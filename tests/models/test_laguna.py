"""Poolside Laguna: config.json read as LagunaConfig / LagunaForCausalLM read it (per-layer query heads, the gate's
width, windows, each layer type's rope width, the router), refusals naming the key. (Logits and greedy tokens on
both backends: the "laguna" variant in tests/conformance; an mlx_lm 4-bit folder: test_mlx_moe_folders.py.)"""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.models.test_config_support import BASE

LAGUNA = {
    **BASE,
    "num_hidden_layers": 4,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "num_attention_heads_per_layer": [4, 8, 4, 8],
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}


@pytest.mark.parametrize("gating", [True, "per-element"])
def test_config_means_what_transformers_builds(gating):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {**LAGUNA, "gating": gating, "moe_router_logit_softcapping": 2.0, "moe_routed_scaling_factor": 1.5}
    ours = ModelConfig.from_hf({"model_type": "laguna", **keys})
    ref = AutoConfig.for_model("laguna", **keys)
    model = AutoModelForCausalLM.from_config(ref, dtype=torch.float32).model
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        assert ours.layer_heads[i] == attn.q_proj.out_features // ref.head_dim
        per_head = ours.attn_output_gate == "softplus_head"
        assert attn.g_proj.out_features == ours.layer_heads[i] * (1 if per_head else ref.head_dim)
        assert ours.layer_windows[i] == attn.sliding_window
        assert ours.moe.is_sparse(i) == hasattr(layer.mlp, "experts")
    rope = ref.rope_parameters
    assert ours.rope_theta == rope["full_attention"]["rope_theta"]
    assert ours.rope_scaling["partial_rotary_factor"] == rope["full_attention"]["partial_rotary_factor"]
    assert ours.local_rope_theta == rope["sliding_attention"]["rope_theta"]
    assert ours.local_rope_dim == ref.head_dim  # the sliding layers turn every dim
    sparse = model.layers[1].mlp
    assert ours.moe.logit_softcap == sparse.gate.router_logit_softcapping == 2.0
    assert ours.moe.routed_scaling_factor == sparse.routed_scaling_factor == 1.5
    assert ours.moe.shared_size == sparse.shared_experts.down_proj.in_features
    assert ours.attn_output_gate == ("softplus_head" if gating is True else "softplus")


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
        ({"gating": "per-token"}, "gating"),
        ({"num_attention_heads_per_layer": [4, 5, 4, 8]}, "num_attention_heads_per_layer"),  # not whole KV groups
        ({"num_attention_heads_per_layer": [4, 8]}, "num_attention_heads_per_layer"),
        ({"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
        # keys mlx_lm or llama.cpp read with other maths (transformers reads none of them)
        ({"gating": False}, "gating"),  # (transformers: a per-channel gate; mlx_lm: none)
        ({"moe_router_score_func": "sqrtsoftplus"}, "moe_router_score_func"),
        ({"gating_types": ["per_head"] * 4}, "gating_types"),
        ({"qkv_bias": True}, "qkv_bias"),
        ({"partial_rotary_factor": 0.25}, "partial_rotary_factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),  # (LagunaConfig drops it)
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "laguna", **LAGUNA, **extra})


def test_tensor_parallelism_is_refused_for_per_layer_heads():
    from lantern.backends.torch.parallel import local_config

    dense = ModelConfig.from_hf({"model_type": "laguna", **LAGUNA, "mlp_layer_types": ["dense"] * 4})
    with pytest.raises(ValueError, match="per-layer query heads"):
        local_config(dense, 2)


@pytest.mark.parametrize("gating", [True, "per-element"])
def test_llama_cpp_gguf_computes_what_transformers_computes(tmp_path, backend, gating):
    """llama.cpp's LagunaModel file (F32) of a folder llama.cpp can mean (XS.2's layer pattern -- every 4th layer full,
    from the first --, no router logit cap: the file has neither): Lantern on it computes what transformers computes
    on the folder -- per-layer heads, the gate per head or per channel, each layer type's rope, the router."""
    from tests.fixtures.gguf_laguna import convert_laguna
    from tests.fixtures.teacher_forcing import assert_file_matches_folder
    from tests.fixtures.tiny_models import build_model

    types = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]
    src = build_model(
        "laguna",
        tmp_path / "hf",
        layer_types=types,
        num_attention_heads_per_layer=[8, 4, 4, 4],
        moe_router_logit_softcapping=0.0,
        gating=gating,
    )
    path = convert_laguna(src, tmp_path / "tiny-laguna.gguf")
    assert_file_matches_folder(path, src, backend, "laguna")
