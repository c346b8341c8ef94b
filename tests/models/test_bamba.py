"""Bamba: its config read as transformers' BambaConfig reads it (which layers attend, the mixer's sizes, half of
each head rotating), refusals by key; logit parity through the paged cache on both backends is in
tests/conformance (variant bamba)."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

# Bamba-9B's keys (32 layers, attention at three of them), with small widths.
RELEASED = {
    "model_type": "bamba",
    "architectures": ["BambaForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 32,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "attn_layer_indices": [9, 18, 27],
    "mamba_n_heads": 16,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 32,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "rope_theta": 10000.0,
    "max_position_embeddings": 262144,
}


def test_config_reads_as_transformers_does():
    from transformers import BambaConfig

    ours = ModelConfig.from_hf(RELEASED)
    ref = BambaConfig(**{k: v for k, v in RELEASED.items() if k not in ("model_type", "architectures")})
    assert [("linear_attention" if m else "full_attention") for m in ours.mamba.mamba_layers] == ref.layers_block_type
    m = ours.mamba
    assert (m.num_heads, m.head_dim, m.state_size, m.groups) == (16, ref.mamba_d_head, 32, 1)
    assert ours.rope_scaling["partial_rotary_factor"] == ref.rope_parameters["partial_rotary_factor"] == 0.5
    assert ours.num_kv_layers == 3 and ours.attn_scale is None and ours.embed_multiplier == 1.0


@pytest.mark.parametrize(
    "change,key",
    [
        ({"attn_layer_indices": []}, "attn_layer_indices"),
        ({"attn_layer_indices": [40]}, "attn_layer_indices"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 1.0}}, "partial_rotary_factor"),
        ({"mamba_d_head": 7}, "mamba_d_head"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**RELEASED, **change})
