"""gpt-oss: config.json read as transformers' GptOssConfig reads it (defaults included, and a config
shaped like openai/gpt-oss-20b's) and refusals in one line naming the key. MXFP4 experts, serving
and --isq: test_gptoss_mxfp4.py.

Logits and 64 greedy tokens of the float model against transformers run in tests/conformance
(variant gpt_oss: sinks, biases, sliding layers, untruncated YaRN, clamped SwiGLU)."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {
    "model_type": "gpt_oss",
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
}
# openai/gpt-oss-20b's config.json (huggingface.co/openai/gpt-oss-20b/raw/main/config.json): every
# key as released, the sizes shrunk (2880 -> 64 wide, 24 -> 4 layers, 32 -> 4 experts).
REAL_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}


def hf(cfg: dict):
    from transformers import GptOssConfig

    return GptOssConfig.from_dict(cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        BASE,  # absent keys: GptOssConfig's defaults (YaRN x32, window 128, even layers slide, 128 experts)
        REAL_20B,
        {**BASE, "layer_types": ["full_attention"] * 4, "rope_parameters": {"rope_type": "default"}},
        {**BASE, "num_experts": 8, "swiglu_limit": 3.0, "swiglu_alpha": 1.5, "rope_theta": 5e5},
    ],
    ids=["defaults", "gpt-oss-20b", "no-window", "aliases"],
)
def test_fields_match_transformers(cfg):
    ours, ref = ModelConfig.from_hf(cfg), hf(cfg)
    windows = [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    assert ours.layer_windows == (windows if any(windows) else None)
    rope = dict(ref.rope_parameters)
    assert ours.rope_theta == rope.pop("rope_theta")
    expected_rope = None if rope.get("rope_type") == "default" else rope
    assert ours.rope_scaling == expected_rope
    assert (ours.moe.num_experts, ours.moe.top_k) == (ref.num_local_experts, ref.num_experts_per_tok)
    assert (ours.moe.swiglu_alpha, ours.moe.swiglu_limit) == (ref.swiglu_alpha, ref.swiglu_limit)
    assert ours.moe.intermediate_size == ref.intermediate_size
    assert (ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        ref.head_dim,
        ref.rms_norm_eps,
        ref.max_position_embeddings,
    )
    assert ours.attention_bias is ref.attention_bias is True
    assert ours.tie_word_embeddings is ref.tie_word_embeddings is False
    assert ours.attn_scale is None  # head_dim ** -0.5, transformers' GptOssAttention.scaling
    assert ours.quantization is None and ours.family == "gptoss"


def test_real_config_serves_its_context():
    cfg = ModelConfig.from_hf(REAL_20B)
    # YaRN states the extended length: original 4096 x 32 = max_position_embeddings.
    assert cfg.max_context == 131072
    assert cfg.rope_scaling["truncate"] is False


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config.quant_method"),
        ({"quantization": {"bits": 7, "group_size": 64}}, "quantization.bits"),  # (MLX folders: read)
        ({"sliding_window": None}, "sliding_window"),
        ({"layer_types": ["chunked_attention"] * 4}, "layer_types"),
        ({"num_local_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 8}}, "rope_scaling.rope_type"),
    ],
)
def test_refused_in_one_line_naming_the_key(extra, key):
    with pytest.raises(UnsupportedModelError) as err:
        ModelConfig.from_hf({**BASE, **extra})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{key}=")


def test_mlx_folders_are_read_with_their_scheme():
    """mlx_lm's folders (mlx-community's gpt-oss): `quantization` (and its copy in quantization_config, or
    that copy alone) is parsed as an MLX scheme: mxfp4 experts, per-module 8-bit entries."""
    q = {"group_size": 32, "bits": 4, "mode": "mxfp4", "model.layers.0.self_attn.q_proj": {"group_size": 32, "bits": 8}}
    for cfg in ({"quantization": q, "quantization_config": q}, {"quantization_config": q}):
        scheme = ModelConfig.from_hf({**BASE, **cfg}).quantization
        assert (scheme.method, scheme.mlx_mode) == ("mlx", "mxfp4")
        assert scheme.mode_for("model.layers.0.self_attn.q_proj") == (8, 32)


# ---- MXFP4 ----------------------------------------------------------------------------------------
