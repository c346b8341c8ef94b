"""Hunyuan dense (Tencent's Hunyuan-0.5B / 1.8B / 4B / 7B and Hunyuan-MT-7B: model_type hunyuan_v1_dense), as
transformers 5's HunYuanDenseV1Config reads its config.json, turned into ModelConfig fields.

The maths (transformers' modeling_hunyuan_v1_dense): Llama's decoder layer whose attention RMS-normalizes each
head's query and key *after* the rope (query_layernorm / key_layernorm; ModelConfig.qk_norm_after_rope), under
the released configs' rope_scaling {"type": "dynamic", "alpha": ...}: transformers reads a fixed alpha as NTK
scaling of the base alone, theta * alpha ** (head_dim / (head_dim - 2)), the same at every length, so it is a
plain rope of that base. Without alpha, "dynamic" is the usual dynamic NTK (rope_config).

Hunyuan MoE (Hunyuan-A13B: model_type hunyuan_v1_moe, transformers' HunYuanMoEV1): the same attention over a
mixture in every layer: a float32 softmax router (`gate.wg`, held in float32) picks moe_topk of num_experts
experts, their weights renormalised to sum to 1, beside an ungated-sum shared MLP (`shared_mlp`); experts and
shared MLP are intermediate_size wide (transformers reads neither moe_intermediate_size nor num_shared_expert).
That is DeepSeek-V2's greedy softmax routing with renormalisation (family_deepseek.DeepSeekMoEConfig).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# HunYuanDenseV1Config's defaults for keys ModelConfig.from_hf defaults otherwise (spec.ARCHITECTURES "defaults")
DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if model_type not in ("hunyuan_v1_dense", "hunyuan_v1_moe"):
        raise UnsupportedModelError(f"family_hunyuan does not configure model_type {model_type!r}")
    check_silu(cfg, "Hunyuan")
    # (mlp_bias: transformers' MLP has none whatever the key says; refused rather than computed without it)
    for key, why in (("attention_bias", " (biases on q/k/v and o_proj)"), ("mlp_bias", " (MLP biases)")):
        if cfg.get(key):
            raise _refuse(key, cfg[key], why)
    for key in ("use_cla", "use_mla"):  # cross-layer / latent attention: transformers' model computes neither
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (transformers' Hunyuan computes plain attention)")
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    head_dim = fields["head_dim"]
    out: dict[str, Any] = {"qk_norm": True, "qk_norm_after_rope": True}
    if model_type == "hunyuan_v1_moe":
        out["moe"] = _experts(cfg, fields)
    if kind == "dynamic" and rope.get("alpha"):
        # in float32, as transformers' rope uses it (a Python float against a float32 tensor) and GGUF stores it
        out["rope_theta"] = float(np.float32(theta * float(rope["alpha"]) ** (head_dim / (head_dim - 2))))
        out["rope_scaling"] = None
    else:
        out["rope_scaling"] = rope_scaling({**cfg, "rope_scaling": None}, rope, fields["max_position_embeddings"])
    return out


def _uniform(cfg: dict[str, Any], key: str, default: int, layers: int) -> int:
    """A per-layer list that must hold one value (or that value)."""
    value = cfg.get(key, default)
    values = value if isinstance(value, list) else [value]
    if not values or len(set(values)) != 1 or (isinstance(value, list) and len(value) != layers):
        raise _refuse(key, value, f" (one value for all {layers} layers)")
    return int(values[0])


def _experts(cfg: dict[str, Any], fields: dict[str, Any]) -> Any:
    from lantern.app.models.family_deepseek import DeepSeekMoEConfig

    layers, width = fields["num_layers"], fields["intermediate_size"]
    experts, top_k = _uniform(cfg, "num_experts", 1, layers), _uniform(cfg, "moe_topk", 1, layers)
    if _uniform(cfg, "moe_intermediate_size", width, layers) != width:  # (transformers sizes both by the latter)
        raise _refuse("moe_intermediate_size", cfg["moe_intermediate_size"], f" (other than intermediate_size {width})")
    for key, bad in (
        ("num_shared_expert", _uniform(cfg, "num_shared_expert", 1, layers) != 1),
        ("use_mixed_mlp_moe", cfg.get("use_mixed_mlp_moe", True) is False),
    ):
        if bad:
            raise _refuse(key, cfg[key], " (transformers' Hunyuan MoE adds one shared MLP)")
    if not 1 <= top_k <= experts:
        raise _refuse("moe_topk", cfg.get("moe_topk"), f" (must be between 1 and the {experts} experts)")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=width,
        norm_topk_prob=True,
        router_weights_fp32=True,  # (the float32 router's weights scale the experts' outputs)
        shared_size=width,
        norm_eps=0.0,
    )


_NAMES = {
    ".self_attn.query_layernorm.": ".self_attn.q_norm.",
    ".self_attn.key_layernorm.": ".self_attn.k_norm.",
    ".mlp.gate.wg.": ".mlp.gate.",  # Hunyuan MoE's router
    ".mlp.shared_mlp.": ".mlp.shared_experts.",
}


def checkpoint_name(name: str) -> str:
    """The per-head query / key norms (and Hunyuan MoE's router and shared MLP) under the model files' names."""
    for old, new in _NAMES.items():
        name = name.replace(old, new)
    return name
