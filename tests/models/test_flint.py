"""Flint (`flint`): config.json read as FlintConfig reads it (its layer pattern, dense layers, router and shared
expert), refusals naming the key, and the released tensor names (`softmax_offset`, `shared_expert`) reaching the
model files. The tiny folder's logits and greedy tokens run in tests/conformance (flint)."""

from __future__ import annotations

import pytest

from lantern.app.models.family_llama_moe import checkpoint_name
from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {"model_type": "flint", "vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}


@pytest.mark.parametrize("layers", [5, 12])
def test_config_matches_transformers(layers):
    from transformers import FlintConfig

    raw = {**BASE, "num_hidden_layers": layers}
    cfg, ref = ModelConfig.from_hf(raw), FlintConfig(**raw)
    sliding = [t == "sliding_attention" for t in ref.layer_types]
    assert cfg.layer_windows == [ref.sliding_window if s else None for s in sliding]
    assert cfg.rope_layers == tuple(sliding)  # the full layers are NoPE
    assert cfg.attn_sinks and cfg.qk_norm and cfg.num_kv_heads == ref.num_key_value_heads
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_size) == (
        ref.num_experts,
        ref.num_experts_per_tok,
        ref.moe_intermediate_size,
        ref.shared_expert_intermediate_size,
    )
    assert moe.scoring == "sigmoid" and not moe.correction_bias and moe.norm_eps == 0.0
    assert [i for i in range(layers) if not moe.is_sparse(i)] == ref.mlp_only_layers
    assert cfg.intermediate_size == ref.intermediate_size  # the dense layers' MLP


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, "num_hidden_layers": 4, **extra})


def test_released_names():
    assert checkpoint_name("model.layers.3.self_attn.softmax_offset") == "model.layers.3.self_attn.sinks"
    assert checkpoint_name("model.layers.3.mlp.shared_expert.up_proj.weight") == (
        "model.layers.3.mlp.shared_experts.up_proj.weight"
    )
    assert (
        checkpoint_name("model.layers.3.mlp.experts.0.up_proj.weight") == "model.layers.3.mlp.experts.0.up_proj.weight"
    )


def test_null_mlp_only_layers_are_flints_default():
    """FlintConfig fills a null mlp_only_layers with [0, 1]: those layers stay dense."""
    cfg = ModelConfig.from_hf({**BASE, "num_hidden_layers": 4, "mlp_only_layers": None})
    assert [i for i in range(4) if not cfg.moe.is_sparse(i)] == [0, 1]
