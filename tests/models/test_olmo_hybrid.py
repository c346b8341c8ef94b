"""OLMo Hybrid (allenai/Olmo-Hybrid-7B: OLMo 3's attention layers between gated delta-net layers) on both backends
against transformers' OlmoHybridForCausalLM on the same tiny folder: logits within 1e-4 through the paged cache and
the recurrent state slots (chunked prefill, 4-token blocks), 64 greedy tokens equal; with and without its rope and
beta's doubling; its config read as OlmoHybridConfig reads it, refusals naming the key."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

BASE = {"model_type": "olmo_hybrid", "vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("olmo_hybrid")
    return {v: build_model(v, root / v) for v in ("olmo_hybrid", "olmo_hybrid_nope")}


@pytest.mark.parametrize("variant", ["olmo_hybrid", "olmo_hybrid_nope"])
def test_matches_transformers(folders, variant, backend):
    assert_file_matches_folder(folders[variant], folders[variant], backend, variant, forced=32, greedy=64)


def test_config_matches_transformers():
    from transformers import OlmoHybridConfig

    raw = {**BASE, "num_hidden_layers": 6, "intermediate_size": 128}
    cfg, ref = ModelConfig.from_hf(raw), OlmoHybridConfig.from_dict(raw)
    la = cfg.linear_attn
    assert la.linear_layers == tuple(t == "linear_attention" for t in ref.layer_types)
    assert (la.num_k_heads, la.num_v_heads, la.k_dim, la.v_dim) == (
        ref.linear_num_key_heads,
        ref.linear_num_value_heads,
        ref.linear_key_head_dim,
        ref.linear_value_head_dim,
    )
    assert (la.beta_scale, la.norm_eps, cfg.rope_layers) == (2.0, 1e-5, None)
    assert cfg.num_kv_layers == ref.layer_types.count("full_attention")


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
        ({"linear_num_value_heads": 3, "linear_num_key_heads": 2}, "linear_num_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, "num_hidden_layers": 4, "intermediate_size": 128, **extra})


def test_split_convolutions_join_in_either_layout():
    """q, k and v kernels joined in that order into conv1d's [3C, 1, K], from Hugging Face's [C, 1, K] or mlx_lm's
    [C, K, 1]; the released names of the norms read as the model files'."""
    import numpy as np

    from lantern.app.models.family_olmo_hybrid import checkpoint_name, checkpoint_tensors

    rng = np.random.default_rng(0)
    parts = {p: rng.standard_normal((6, 1, 4)).astype(np.float32) for p in "qkv"}
    want = np.concatenate([parts[p] for p in "qkv"])
    for layout in (lambda a: a, lambda a: a.transpose(0, 2, 1)):
        stream = [(f"model.layers.0.linear_attn.{p}_conv1d.weight", layout(parts[p])) for p in "kqv"]
        ((name, value),) = list(checkpoint_tensors(iter(stream), None))
        assert name == "model.layers.0.linear_attn.conv1d.weight"
        np.testing.assert_array_equal(value, want)
    assert (
        checkpoint_name("model.layers.3.feedforward_layer_norm.weight")
        == "model.layers.3.post_attention_layernorm.weight"
    )
    assert checkpoint_name("model.layers.0.linear_attn.o_norm.weight") == "model.layers.0.linear_attn.norm.weight"
