"""Arcee Trinity (AFMoE): what a config.json means is what transformers' AfmoeConfig / AfmoeForCausalLM make of it,
keys other loaders read with other maths are refused naming them, and a GGUF's metadata reads as llama.cpp's afmoe
graph runs it. (Logits on both backends: tests/conformance/test_parity.py's "afmoe" variant, the mlx_lm folder in
test_mlx_moe_folders.py, the GGUF file in test_gguf_families.py.)"""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.models.test_config_support import BASE

TRINITY = {"num_hidden_layers": 8, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def cfg(model_type: str, **extra) -> dict:
    return {"model_type": model_type, **BASE, **extra}


def hf_config(model_type: str, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**BASE, **extra})


def test_config_means_what_transformers_builds():
    import torch
    from transformers import AutoModelForCausalLM

    ours = ModelConfig.from_hf(cfg("afmoe", **TRINITY, num_dense_layers=2, route_scale=2.5, mup_enabled=True))
    ref = hf_config("afmoe", **TRINITY, num_dense_layers=2, route_scale=2.5, mup_enabled=True)
    model = AutoModelForCausalLM.from_config(ref, dtype=torch.float32).model
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        assert ours.rope_layers[i] == attn.is_local_attention  # the rope turns on the sliding layers only
        assert ours.layer_windows[i] == attn.sliding_window
        assert ours.moe.is_sparse(i) == layer.moe_enabled
    assert ours.layer_windows.count(None) == 2  # every 4th layer full (AfmoeConfig's default)
    sparse = model.layers[2].mlp
    assert (ours.moe.num_experts, ours.moe.top_k) == (sparse.router.num_experts, sparse.router.top_k)
    assert ours.moe.routed_scaling_factor == sparse.router.route_scale == 2.5
    assert ours.moe.shared_size == sparse.shared_experts.intermediate_size  # num_shared_experts x the expert width
    assert ours.moe.norm_topk_prob and ours.moe.scoring == "sigmoid" and ours.moe.correction_bias
    assert ours.qk_norm and ours.attn_output_gate
    assert ours.embed_multiplier == ref.hidden_size**0.5
    assert ours.head_dim == ref.head_dim and ours.num_kv_heads == ref.num_key_value_heads
    assert ModelConfig.from_hf(cfg("afmoe", **TRINITY)).embed_multiplier == 1.0  # (mup_enabled false by default)


def test_defaults_are_afmoe_configs():
    from transformers import AfmoeConfig

    ours, ref = ModelConfig.from_hf({"model_type": "afmoe"}), AfmoeConfig()  # every key from the class's defaults
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        ref.hidden_size,
        ref.num_hidden_layers,
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.head_dim,
    )
    assert (ours.vocab_size, ours.max_position_embeddings, ours.rms_norm_eps) == (
        ref.vocab_size,
        ref.max_position_embeddings,
        ref.rms_norm_eps,
    )
    assert ours.moe.first_dense == ref.num_dense_layers and ours.moe.top_k == ref.num_experts_per_tok
    assert ours.sliding_window == ref.sliding_window


@pytest.mark.parametrize(
    "key,value",
    [
        ("route_norm", False),  # mlx_lm and llama.cpp read these; transformers' router is always the same
        ("score_func", "softmax"),
        ("n_group", 2),
        ("topk_group", 2),
        ("attention_bias", True),
        ("hidden_act", "gelu"),
        ("layer_types", ["full_attention"]),  # one for each layer
    ],
)
def test_maths_it_does_not_compute_are_refused_naming_the_key(key, value):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(cfg("afmoe", **TRINITY, **{key: value}))


def test_released_router_keys_are_accepted():
    released = {"route_norm": True, "score_func": "sigmoid", "n_group": 1, "topk_group": 1}  # Trinity's config.json
    assert ModelConfig.from_hf(cfg("afmoe", **TRINITY, **released)).moe.norm_topk_prob


def _builder_config(extra: dict) -> dict:
    from lantern.app.models.gguf_config import _Meta
    from lantern.app.models.gguf_moe_builders import _afmoe

    keys = {
        "general.architecture": "afmoe",
        "afmoe.expert_count": 8,
        "afmoe.expert_used_count": 2,
        "afmoe.expert_feed_forward_length": 32,
        "afmoe.expert_weights_norm": True,
        **extra,
    }
    return _afmoe(
        _Meta(keys, "tiny.gguf"),
        {},
        {"num_hidden_layers": 8, "rope_theta": 1e4, "hidden_size": 64, "num_attention_heads": 4},
    )


def test_gguf_metadata_reads_as_llama_cpps_graph():
    out = _builder_config({"afmoe.attention.sliding_window": 16})
    assert out["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + [
        "full_attention"
    ]
    assert out["sliding_window"] == 16 and out["mup_enabled"] and out["num_dense_layers"] == 0
    assert out["route_scale"] == 1.0 and out["route_norm"]
    # without a window every layer attends to all; the rope still skips each 4th (its NoPE layers)
    plain = ModelConfig.from_hf(
        {
            "model_type": "afmoe",
            **_builder_config({}),
            "vocab_size": 400,
            "intermediate_size": 64,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 8,
        }
    )
    assert plain.layer_windows is None and plain.rope_layers == (True, True, True, False) * 2


@pytest.mark.parametrize(
    "extra,named",
    [
        ({"afmoe.expert_gating_func": 1}, "expert_gating_func"),
        ({"afmoe.rope.freq_base_swa": 5e5}, "freq_base_swa"),
        ({"afmoe.attention.sliding_window": 16, "afmoe.attention.sliding_window_pattern": 2}, "sliding_window_pattern"),
    ],
)
def test_gguf_metadata_it_does_not_compute_is_refused(extra, named):
    with pytest.raises(UnsupportedModelError, match=named):
        _builder_config(extra)
