"""OLMo 2 / OLMo 3 / OLMoE: config.json read as transformers' Olmo2Config / Olmo3Config / OlmoeConfig read it
(defaults included: OLMo 3's layer pattern, window and per-layer-type rope; OLMoE's experts), refusals naming
the key, and tensor parallelism refused. Logits and greedy tokens run in tests/conformance (olmo2, olmo3,
olmoe), GGUF files in test_gguf_families.py, MLX-format folders in test_mlx_moe_folders.py."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def ours(model_type: str, **extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": model_type, "num_hidden_layers": 8, **BASE, **extra})


def hf(model_type: str, **extra):
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type))
    return cls.from_dict({"model_type": model_type, "num_hidden_layers": 8, **BASE, **extra})


YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("olmo2", {}),
        ("olmo2", {"num_key_value_heads": 2, "rope_theta": 500000.0, "max_position_embeddings": 4096}),
        ("olmo3", {}),  # three sliding layers then a full one, window 4096, base 500000 for both
        ("olmo3", {"rope_scaling": YARN, "max_position_embeddings": 65536}),  # an older save: YaRN on full layers
        ("olmo3", {"layer_types": ["full_attention"] * 8}),  # no sliding layer: one rope
        ("olmo3", {"rope_theta": 10000.0}),  # a flat base is the full layers' only (sliding: 500000)
    ],
)
def test_config_matches_transformers(model_type, extra):
    cfg, ref = ours(model_type, **extra), hf(model_type, **extra)
    assert (cfg.num_kv_heads, cfg.rms_norm_eps, cfg.max_position_embeddings) == (
        ref.num_key_value_heads,
        ref.rms_norm_eps,
        ref.max_position_embeddings,
    )
    assert cfg.family == "olmo" and not cfg.qk_norm  # the whole-projection norms are the family's own
    if model_type == "olmo2":
        assert cfg.rope_theta == ref.rope_parameters["rope_theta"] and cfg.layer_windows is None
        return
    windows = [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    assert (cfg.layer_windows or [None] * 8) == windows
    full, local = ref.rope_parameters["full_attention"], ref.rope_parameters["sliding_attention"]
    assert cfg.rope_theta == full["rope_theta"]
    assert (cfg.rope_scaling or {}).get("rope_type", "default") == full["rope_type"]
    if full["rope_type"] == "yarn":
        assert cfg.rope_scaling["factor"] == full["factor"]
    assert cfg.local_rope_theta == (local["rope_theta"] if any(windows) else None)


@pytest.mark.parametrize(
    "model_type,extra,key",
    [
        ("olmo2", {"attention_bias": True}, "attention_bias"),
        ("olmo2", {"hidden_act": "gelu"}, "hidden_act"),
        ("olmo3", {"mlp_bias": True}, "mlp_bias"),
        ("olmo3", {"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ("olmo3", {"sliding_window": None}, "sliding_window"),
        (
            "olmo3",
            {"rope_parameters": {"sliding_attention": YARN, "full_attention": {"rope_type": "default"}}},
            "rope_parameters.sliding_attention.rope_type",
        ),
        ("olmo3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters.rope_theta"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(model_type, extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ours(model_type, **extra)


@pytest.mark.parametrize("extra", [{}, {"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}])
def test_olmoe_config_matches_transformers(extra):
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

    cfg, ref = ours("olmoe", **extra), hf("olmoe", **extra)
    block = OlmoeSparseMoeBlock(ref)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.norm_topk_prob) == (
        ref.num_experts,
        ref.num_experts_per_tok,
        ref.norm_topk_prob,
    )
    assert moe.intermediate_size == block.experts.down_proj.shape[-1] == ref.intermediate_size
    assert moe.is_sparse(0) and cfg.family == "olmoe" and not cfg.qk_norm  # whole-projection q/k norms
    assert (cfg.rope_theta, cfg.max_position_embeddings, cfg.rms_norm_eps) == (
        ref.rope_parameters["rope_theta"],
        ref.max_position_embeddings,
        ref.rms_norm_eps,
    )
    with pytest.raises(UnsupportedModelError, match="clip_qkv"):
        ours("olmoe", clip_qkv=8.0)


def test_tensor_parallelism_is_refused_before_any_worker_starts():
    from lantern.backends.torch.models.olmo import CausalLM
    from lantern.backends.torch.parallel import TPGroup, local_config

    with pytest.raises(ValueError, match=r"OLMo.*tensor-parallel-size 1"):
        local_config(ours("olmo2"), 2)  # what the runner calls before it spawns the ranks
    with pytest.raises(ValueError, match="tensor-parallel-size 1"):
        CausalLM(ours("olmo2"), TPGroup(rank=0, world=2))
