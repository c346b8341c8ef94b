"""Arcee Trinity (model_type "afmoe": arcee-ai/Trinity-Nano / Trinity-Mini / Trinity-Large): what its config.json
means, as transformers' AfmoeConfig reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_afmoe): per-head q/k RMSNorms before the rope; the rope only on the sliding
layers (the full-attention ones, every global_attn_every_n_layers-th by default, are NoPE); the attention's output
times sigmoid(gate_proj(x)) before o_proj (ModelConfig.attn_output_gate); Gemma 2's sandwich of norms (after
attention, before and after the MLP) with plain RMSNorms; the first num_dense_layers a dense MLP, the rest
DeepSeek-V3's mixture without groups: sigmoid scores, the choice by score + expert_bias, the chosen scores
renormalised and times route_scale, num_shared_experts always-on experts as one MLP beside them; with mup_enabled
the embedding times sqrt(hidden_size). llama.cpp's `afmoe` GGUFs: gguf_builders._afmoe.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.spec import UnsupportedModelError

_LAYER_TYPES = ("sliding_attention", "full_attention")

# AfmoeConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 200192,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 16384,
}

# checkpoint name -> the model files' (the router and its bias as DeepSeek's, the MLP's norms as Gemma 2's)
_NAMES = {
    ".mlp.router.gate.": ".mlp.gate.",
    ".mlp.expert_bias": ".mlp.gate.e_score_correction_bias",
    ".pre_mlp_layernorm.": ".pre_feedforward_layernorm.",
    ".post_mlp_layernorm.": ".post_feedforward_layernorm.",
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an afmoe config; refuses, naming the key, what it does not compute."""
    if model_type != "afmoe":
        raise UnsupportedModelError(f"family_afmoe does not configure model_type {model_type!r}")
    check_silu(cfg, "AFMoE")
    if cfg.get("attention_bias"):  # (LlamaAttention's would bias o_proj too)
        raise refuse("attention_bias", cfg["attention_bias"], " for afmoe (biases on the projections)")
    # Keys mlx_lm and llama.cpp read that AfmoeConfig does not (its router is always these): refused when they
    # ask for other maths, so that no loader computes a different model from the same folder.
    for key, value in (("score_func", "sigmoid"), ("route_norm", True), ("n_group", 1), ("topk_group", 1)):
        if cfg.get(key, value) != value:
            raise refuse(key, cfg[key], f" for afmoe (transformers' router: {key}={value!r} always)")
    layers = fields["num_layers"]
    types = _layer_types(cfg, layers)
    window = cfg.get("sliding_window", 1024)
    windows = [int(window) if t == "sliding_attention" and window else None for t in types]
    return {
        "qk_norm": True,
        "attn_output_gate": "sigmoid",
        "rope_layers": tuple(t == "sliding_attention" for t in types),
        "layer_windows": windows if any(windows) else None,
        "embed_multiplier": float(cfg["hidden_size"]) ** 0.5 if cfg.get("mup_enabled") else 1.0,
        "moe": _experts(cfg, layers),
    }


def _layer_types(cfg: dict[str, Any], layers: int) -> list[str]:
    every = cfg.get("global_attn_every_n_layers", 4)
    if not isinstance(every, int) or every < 1:
        raise refuse("global_attn_every_n_layers", every, " (a positive number of layers)")
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
    ]
    if len(types) != layers or set(types) - set(_LAYER_TYPES):
        raise refuse("layer_types", types, f" ({' or '.join(_LAYER_TYPES)} for each of the {layers} layers)")
    return list(types)


def _experts(cfg: dict[str, Any], layers: int) -> DeepSeekMoEConfig | None:
    experts = int(cfg.get("num_experts", 64) or 0)
    dense = int(cfg.get("num_dense_layers", 1) or 0)
    if experts == 0 or dense >= layers:
        return None  # every layer a dense MLP
    top_k = int(cfg.get("num_experts_per_tok", 6))
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    inner = int(cfg.get("moe_intermediate_size", 1408))
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=True,
        router_weights_fp32=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        routed_scaling_factor=float(cfg.get("route_scale", 1.0)),
        first_dense=dense,
        correction_bias=True,
        shared_size=int(cfg.get("num_shared_experts", 2) or 0) * inner,
    )


def checkpoint_name(name: str) -> str:
    """An AFMoE tensor under the model files' names (its router and MLP norms renamed; the rest Llama's)."""
    for old, new in _NAMES.items():
        name = name.replace(old, new)
    return name
