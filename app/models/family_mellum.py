"""JetBrains Mellum 2 (model_type "mellum": JetBrains/Mellum2-12B-A2.5B): what its config.json means, as
transformers' MellumConfig reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_mellum): Qwen3-MoE's attention (per-head q/k RMSNorms before the rope) and
mixture (a softmax over every expert, the top-k kept, renormalised with norm_topk_prob) in Llama's pre-norm layer;
layers of two types (layer_types) -- sliding ones attend within sliding_window -- each with its own rope
(rope_parameters nested by type: the full layers' base 500000, possibly scaled, the sliding layers' a plain 10000,
Gemma 3's arrangement); mlp_layer_types says which layers are dense MLPs. The multi-token-prediction module
(`mtp.*`) is skipped. (llama.cpp's `mellum` GGUFs are not read: its graph turns the sliding layers with the full
layers' base.)
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_moe import MoEConfig, mlp_kinds
from lantern.app.models.family_olmo import layer_type_rope, typed_windows
from lantern.app.models.spec import UnsupportedModelError

# MellumConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 98304,
    "hidden_size": 2304,
    "intermediate_size": 7168,
    "num_hidden_layers": 28,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a mellum config; refuses, naming the key, what it does not compute."""
    if model_type != "mellum":
        raise UnsupportedModelError(f"family_mellum does not configure model_type {model_type!r}")
    check_silu(cfg, "Mellum")
    if cfg.get("attention_bias"):  # (Qwen3MoeAttention's would bias o_proj too)
        raise refuse("attention_bias", cfg["attention_bias"], " for mellum (biases on the projections)")
    layers, max_pos = fields["num_layers"], int(cfg.get("max_position_embeddings", 131072))
    windows = typed_windows(cfg, layers, ["full_attention"] * layers, 1024)
    rope = layer_type_rope(cfg, max_pos, 500000.0, 10000.0, model_type="mellum", legacy=False)
    local = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
    if float(local.get("partial_rotary_factor", 1.0)) != 1.0:  # (MellumAttention turns whole heads)
        raise refuse("rope_parameters.sliding_attention.partial_rotary_factor", local["partial_rotary_factor"])
    if windows is None:
        rope["local_rope_theta"] = None  # no sliding layer: one rope
    return {
        "qk_norm": True,
        "layer_windows": windows,
        "moe": _experts(cfg, layers),
        **rope,
    }


def _experts(cfg: dict[str, Any], layers: int) -> MoEConfig | None:
    kinds = mlp_kinds(cfg, layers, ["sparse"] * layers)
    experts = int(cfg.get("num_experts", cfg.get("num_local_experts", 64)) or 0)
    if experts == 0 or "sparse" not in kinds:
        return None
    top_k = int(cfg.get("num_experts_per_tok", 8))
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 896)),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
    )
