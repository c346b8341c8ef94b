"""GLM-4.5 (glm4_moe: GLM-4.5, 4.5-Air, 4.6, 4.7) and GLM-4.7-Flash (glm4_moe_lite): config.json read as
transformers' Glm4MoeConfig / Glm4MoeLiteConfig read it (defaults included), refusals naming the key,
and a released-shape checkpoint — a multi-token-prediction layer after the stack, a non-zero
e_score_correction_bias (the tiny fixtures leave it at zero), grouped routing — through the paged cache
on both backends against transformers.

Logits and greedy tokens of the plain variants run in tests/conformance (glm4_moe, glm4_moe_lite), their
MLX-format 4-bit folders in test_mlx_moe_folders.py, a glm4moe GGUF in test_gguf_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

BASE = {
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,  # Glm4MoeConfig's 8 KV heads divide them
    "num_hidden_layers": 4,
    "moe_intermediate_size": 32,
}


def ours(model_type: str, **extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": model_type, **BASE, **extra})


def hf(model_type: str, **extra):
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type))
    return cls.from_dict({"model_type": model_type, **BASE, **extra})


GLM_CONFIGS = [
    {"n_routed_experts": 16},  # Glm4MoeConfig's defaults: 8 of 128 would not fit, 8 KV heads, half rotary
    {"num_key_value_heads": 2, "head_dim": 24, "use_qk_norm": True, "attention_bias": True, "n_routed_experts": 8,
     "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 2, "norm_topk_prob": False,
     "routed_scaling_factor": 2.5, "n_shared_experts": 2, "num_nextn_predict_layers": 0, "partial_rotary_factor": 0.25},
]  # fmt: skip


@pytest.mark.parametrize("extra", GLM_CONFIGS)
def test_glm4_moe_config_matches_transformers(extra):
    cfg, ref = ours("glm4_moe", **extra), hf("glm4_moe", **extra)
    head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (ref.num_key_value_heads, head_dim, ref.rms_norm_eps)
    assert (cfg.attention_bias, cfg.qk_norm) == (ref.attention_bias, ref.use_qk_norm)
    assert cfg.max_position_embeddings == ref.max_position_embeddings
    partial = ref.rope_parameters.get("partial_rotary_factor", 1.0)
    assert (cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0) == partial
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (
        ref.n_routed_experts,
        ref.num_experts_per_tok,
        ref.moe_intermediate_size,
    )
    assert (moe.scoring, moe.n_group, moe.topk_group, moe.norm_topk_prob) == (
        "sigmoid",
        ref.n_group,
        ref.topk_group,
        ref.norm_topk_prob,
    )
    assert moe.routed_scaling_factor == ref.routed_scaling_factor
    assert moe.shared_size == ref.moe_intermediate_size * ref.n_shared_experts
    assert [moe.is_sparse(i) for i in range(4)] == [i >= ref.first_k_dense_replace for i in range(4)]
    assert cfg.mtp_layers == ref.num_mtp_layers  # skipped while loading
    assert cfg.family == "llama_moe" and cfg.mla is None


LITE_CONFIGS = [
    {"num_key_value_heads": 8, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
     "v_head_dim": 20},  # the rest Glm4MoeLiteConfig's defaults: layer 0 dense, 4 of 64 experts
    {"num_key_value_heads": 8, "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
     "v_head_dim": 16, "rope_interleave": False, "n_routed_experts": 8, "num_experts_per_tok": 2,
     "mlp_layer_types": ["sparse", "dense", "sparse", "dense"]},
]  # fmt: skip


@pytest.mark.parametrize("extra", LITE_CONFIGS)
def test_glm4_moe_lite_config_matches_transformers(extra):
    cfg, ref = ours("glm4_moe_lite", **extra), hf("glm4_moe_lite", **extra)
    m = cfg.mla
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        ref.kv_lora_rank,
        ref.q_lora_rank,
        ref.qk_nope_head_dim,
        ref.qk_rope_head_dim,
        ref.v_head_dim,
    )
    assert m.rope_interleave == ref.rope_interleave
    assert cfg.attn_scale == pytest.approx(ref.qk_head_dim**-0.5)
    assert cfg.family == "deepseek"
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.routed_scaling_factor, moe.scoring) == (
        ref.n_routed_experts,
        ref.num_experts_per_tok,
        ref.routed_scaling_factor,
        "sigmoid",
    )
    assert [moe.is_sparse(i) for i in range(4)] == [kind == "sparse" for kind in ref.mlp_layer_types]


REFUSED = [
    ("glm4_moe", {"hidden_act": "gelu"}, "hidden_act"),
    ("glm4_moe", {"n_routed_experts": 8, "n_group": 3}, "n_group"),
    ("glm4_moe", {"n_routed_experts": 8, "scoring_func": "softmax"}, "scoring_func"),
    ("glm4_moe", {"n_routed_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("glm4_moe", {"n_routed_experts": 8, "num_key_value_heads": 3}, "num_key_value_heads"),
    ("glm4_moe", {"n_routed_experts": 8, "partial_rotary_factor": 0.375}, "partial_rotary_factor"),  # 3 of 8: odd
    ("glm4_moe", {"n_routed_experts": 8, "num_nextn_predict_layers": -1}, "num_nextn_predict_layers"),
    ("glm4_moe_lite", {"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),  # 2 kinds for 4 layers
    ("glm4_moe_lite", {"first_k_dense_replace": 2}, "first_k_dense_replace"),  # transformers would ignore it
    ("glm4_moe_lite", {"attention_bias": True}, "attention_bias"),
]


@pytest.mark.parametrize("model_type,extra,key", REFUSED, ids=[f"{m}-{k}" for m, _, k in REFUSED])
def test_unimplemented_keys_are_refused_by_name(model_type, extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ours(model_type, **extra)


@pytest.fixture(scope="module")
def released_shape(tmp_path_factory):
    """A tiny glm4_moe saved the way GLM-4.5's checkpoints are: one multi-token-prediction layer after
    the stack (model.layers.{num_hidden_layers}: its own norms and eh_proj, then a whole MoE layer),
    a router bias large enough to change the choice, and experts in 4 groups of which 2 are routable."""
    from safetensors.numpy import load_file, save_file

    path = build_model(
        "glm4_moe", tmp_path_factory.mktemp("glm4_moe_mtp"), n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, num_nextn_predict_layers=1,
    )  # fmt: skip
    cfg = json.loads((path / "config.json").read_text())
    assert cfg.get("num_nextn_predict_layers", cfg.get("num_mtp_layers")) == 1
    weights = load_file(str(path / "model.safetensors"))
    rng = np.random.default_rng(0)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    weights[bias] = (0.5 * rng.standard_normal(weights[bias].shape)).astype(np.float32)
    last, mtp = cfg["num_hidden_layers"] - 1, cfg["num_hidden_layers"]
    for name in [n for n in weights if n.startswith(f"model.layers.{last}.")]:
        weights[name.replace(f".{last}.", f".{mtp}.", 1)] = weights[name] + 1.0  # values nothing may read
    d = cfg["hidden_size"]
    weights[f"model.layers.{mtp}.eh_proj.weight"] = rng.standard_normal((d, 2 * d)).astype(np.float32)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"model.layers.{mtp}.{norm}.weight"] = np.ones(d, np.float32)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_released_shape_checkpoint_matches_transformers(released_shape, backend, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        llm = LLM(str(released_shape), backend=backend, dtype="float32", block_size=4, num_kv_blocks=64)
    assert "multi-token-prediction" in caplog.text
    ref = hf_model(str(released_shape))
    assert ref.model.layers[1].mlp.gate.e_score_correction_bias.abs().sum() > 0  # what was saved is used
    assert_matches_reference(llm, ref, PROMPT)
