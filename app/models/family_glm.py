"""GLM-4 (model_type "glm4": GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1; and "glm": glm-4-9b-chat-hf, GLM-4's first
release in transformers' own code): what its config.json means, as transformers' Glm4Config / GlmConfig read it
(defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_glm4): Llama's attention with q/k/v biases, rope on the first
int(head_dim * partial_rotary_factor) dims of each head (default factor 0.5) rotating
*consecutive pairs* (x0, x1), (x2, x3), ... rather than the two halves, post-sublayer norms
(post_self_attn_layernorm, post_mlp_layernorm) before each residual add, and a SiLU-gated MLP
whose gate and up projections are one gate_up_proj in the checkpoint (gate rows first). "glm" (modeling_glm) is
the same without the post-sublayer norms: Llama's layer (family llama) with that rope (ModelConfig.rope_interleaved).

GLM-4.5 (modeling_glm4_moe) is another design: Llama's decoder layer (pre-norms only), attention
with q/k/v biases, optional per-head q/k RMSNorms (use_qk_norm) and rope on the first half of each
head rotating the two *halves* of that part (rotate_half, not GLM-4's pairs); layers from
first_k_dense_replace on are DeepSeek-V3's mixture (sigmoid router with e_score_correction_bias and
grouped top-k, float32 weights times routed_scaling_factor, shared experts always on:
family_deepseek.routed_experts). Its checkpoints carry num_nextn_predict_layers multi-token-prediction
layers after the decoder's, skipped while loading (ModelConfig.mtp_layers).
"""

from __future__ import annotations

import json
from typing import Any

from lantern.app.models.errors import check_silu
from lantern.app.models.family_deepseek import mtp_layers, routed_experts
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# Glm4Config's defaults where config.json leaves a key out (they differ from ModelConfig.from_hf's).
_DEFAULTS: dict[str, Any] = {
    "head_dim": 128,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1.5625e-07,
    "max_position_embeddings": 131072,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,  # Glm4Config.__post_init__: "assign default for BC"
    "eos_token_id": [151329, 151336, 151338],
}


# GLM-4.1V / GLM-4.6V-Flash (glm4v) and GLM-4.5V / GLM-4.6V (glm4v_moe) folders: their language models are
# GLM-4's and GLM-4.5's under a multimodal rope (mrope_section) that is theirs for text (all three position
# ids are the token's), so the keys are dropped. Their text config classes' defaults differ from GLM-4's and
# GLM-4.5's (Glm4vTextConfig / Glm4vMoeTextConfig), and GLM-4.1V's attention always has q/k/v biases.
# glm46v: GLM-4.6V-Flash's own wrapper type in transformers 5 (Glm46VForConditionalGeneration is Glm4v's model)
_WRAPPED = {"glm4v": "glm4", "glm46v": "glm4", "glm4v_moe": "glm4_moe"}
_TEXT_DEFAULTS = {
    "glm4v": {"rms_norm_eps": 1e-5, "max_position_embeddings": 32768},
    "glm46v": {"rms_norm_eps": 1e-5, "max_position_embeddings": 32768},  # (its text_config is Glm4vTextConfig)
    "glm4v_moe": {"attention_bias": True, "max_position_embeddings": 65536},
}


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config inside a GLM-4.xV config.json (the wrapper ties, by default no)."""
    from lantern.app.models.spec import wrapped_text_config

    kind = cfg["model_type"]
    # tied by the wrapper's key, or by text_config's when the wrapper's is off (Glm4vConfig.__post_init__)
    tie = cfg.get("tie_word_embeddings") or (cfg.get("text_config") or {}).get("tie_word_embeddings", False)
    text = wrapped_text_config(cfg, _WRAPPED[kind], tie, _TEXT_DEFAULTS[kind])
    if kind == "glm4v_moe":
        text.pop("use_qk_norm", None)  # Glm4vMoeTextConfig has none: its attention never norms q/k
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(text.get(key), dict):
            text[key] = {k: v for k, v in text[key].items() if not k.startswith("mrope_")}
    if kind in ("glm4v", "glm46v"):
        text["attention_bias"] = True
        text.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])  # (GLM-4's default: 128)
        stated = (text.get("rope_parameters") or {}).get("partial_rotary_factor", text.get("partial_rotary_factor"))
        text["partial_rotary_factor"] = 1.0 if stated is None else stated  # (GLM-4's default: 0.5)
    return text


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a glm4 config (called by spec.ModelConfig.from_hf, which
    skips its Llama-family checks for configure families: the keys are checked here)."""
    if model_type == "glm4_moe":
        return _configure_moe(cfg, fields)
    if model_type not in ("glm4", "glm"):
        raise UnsupportedModelError(f"family_glm does not configure model_type {model_type!r}")
    check_silu(cfg, "GLM-4")
    # Keys Glm4Config does not have are ignored by transformers (mlp_bias, sliding_window, ...):
    # ignoring them here too is what matches its forward pass.
    full = {key: cfg[key] if cfg.get(key) is not None else value for key, value in _DEFAULTS.items()}
    heads = fields["num_heads"]
    kv_heads, head_dim = int(full["num_key_value_heads"]), int(full["head_dim"])
    if heads % kv_heads or head_dim % 2:
        raise UnsupportedModelError(
            f"num_attention_heads={heads}, num_key_value_heads={kv_heads}, head_dim={head_dim} in config.json "
            "are not implemented (query heads must be a multiple of KV heads, head_dim even)"
        )
    max_pos = int(full["max_position_embeddings"])
    # The rope with Glm4Config's defaults filled in: partial factor from rope_parameters, else the
    # top-level key, else 0.5 (transformers' precedence); head_dim for the even-width check.
    rope_cfg = {**cfg, "head_dim": head_dim, "partial_rotary_factor": full["partial_rotary_factor"]}
    rope = dict(cfg.get("rope_parameters") or {})
    eos = full["eos_token_id"]
    return {
        "head_dim": head_dim,
        "num_kv_heads": kv_heads,
        "rms_norm_eps": float(full["rms_norm_eps"]),
        "max_position_embeddings": max_pos,
        "attention_bias": bool(full["attention_bias"]),
        "rope_scaling": rope_scaling(rope_cfg, rope, max_pos),
        "eos_token_ids": [eos] if isinstance(eos, int) else list(eos),
        "hidden_act": "silu",
        "qk_norm": False,
        "rope_interleaved": True,  # (glm4's model file passes it itself; glm runs Llama's layer)
    }


# Glm4MoeConfig's defaults for the keys read here (the router's are family_deepseek's).
_MOE_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "attention_bias": False,
    "use_qk_norm": False,
    "partial_rotary_factor": 0.5,  # Glm4MoeConfig.__post_init__, as Glm4Config's
}


def _configure_moe(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "GLM-4.5")
    # Keys Glm4MoeConfig does not have (mlp_bias, ...) are ignored by transformers: here too.
    full = {key: cfg[key] if cfg.get(key) is not None else value for key, value in _MOE_DEFAULTS.items()}
    heads, kv_heads = fields["num_heads"], int(full["num_key_value_heads"])
    head_dim = fields["head_dim"]  # config.json's head_dim (GLM-4.5: 128 with 96 heads of a 4096 model)
    if heads % kv_heads:
        raise UnsupportedModelError(
            f"num_attention_heads={heads}, num_key_value_heads={kv_heads} in config.json are not implemented "
            "(query heads must be a multiple of KV heads)"
        )
    max_pos = int(full["max_position_embeddings"])
    rope_cfg = {**cfg, "head_dim": head_dim, "partial_rotary_factor": full["partial_rotary_factor"]}
    num_layers = fields["num_layers"]
    return {
        "num_kv_heads": kv_heads,
        "rms_norm_eps": float(full["rms_norm_eps"]),
        "max_position_embeddings": max_pos,
        "attention_bias": bool(full["attention_bias"]),
        "qk_norm": bool(full["use_qk_norm"]),
        "rope_scaling": rope_scaling(rope_cfg, dict(cfg.get("rope_parameters") or {}), max_pos),
        "hidden_act": "silu",
        "moe": routed_experts("glm4_moe", cfg, num_layers),
        "mtp_layers": mtp_layers("glm4_moe", cfg),
    }
