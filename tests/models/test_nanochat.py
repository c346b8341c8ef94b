"""NanoChat: config.json read as NanoChatConfig reads it and refusals naming the key. (Logits and greedy tokens on
both backends, the rope turned the other way included: the "nanochat" variant in tests/conformance; an mlx_lm 4-bit
folder: test_mlx_moe_folders.py.)"""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError


def test_defaults_are_nanochat_configs():
    from transformers import NanoChatConfig

    ours, ref = ModelConfig.from_hf({"model_type": "nanochat"}), NanoChatConfig()
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        ref.hidden_size,
        ref.num_hidden_layers,
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.hidden_size // ref.num_attention_heads,
    )
    assert (ours.vocab_size, ours.intermediate_size, ours.rms_norm_eps) == (
        ref.vocab_size,
        ref.intermediate_size,
        ref.rms_norm_eps,
    )
    assert ours.final_softcap == ref.final_logit_softcapping and ours.hidden_act == ref.hidden_act == "relu2"
    assert ours.rope_reversed and ours.qk_norm_after_rope and ours.embed_norm
    uncapped = ModelConfig.from_hf({"model_type": "nanochat", "final_logit_softcapping": None})
    assert uncapped.final_softcap is None


@pytest.mark.parametrize(
    "extra,key", [({"hidden_act": "silu"}, "hidden_act"), ({"attention_bias": True}, "attention_bias")]
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "nanochat", **extra})
