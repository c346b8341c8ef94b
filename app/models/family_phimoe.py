"""Phi-3.5-MoE / Phi-tiny-MoE (model_type phimoe), as transformers' PhimoeConfig reads its config.json (defaults
included), turned into ModelConfig fields.

The maths (transformers' modeling_phimoe): Llama's decoder layer under LayerNorms with biases (eps rms_norm_eps),
attention with biases on q, k, v and o_proj (attention_bias), a head with a bias (lm_head_bias), and Mixtral's
experts chosen by SparseMixer: the first expert is the best logit, weighted by the softmax over the logits within
2 * router_jitter_noise (relative) of it; the second the best of the rest, weighted by the softmax of the rest
within that margin of it. The weights are not renormalised. LongRoPE as Phi-3's, its cos / sin scaled by
short_mscale or long_mscale (equal in the released configs: one attention_factor here).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# PhimoeConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32064,
    "hidden_size": 4096,
    "intermediate_size": 6400,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a phimoe config; refuses, naming the key, what it does not compute."""
    if model_type != "phimoe":
        raise UnsupportedModelError(f"family_phimoe does not configure model_type {model_type!r}")
    check_silu(cfg, "PhiMoE")
    experts, top_k = int(cfg.get("num_local_experts", 16)), int(cfg.get("num_experts_per_tok", 2))
    if top_k != 2:  # (SparseMixer picks two experts, whatever the key says)
        raise _refuse("num_experts_per_tok", top_k, " (PhiMoE's SparseMixer routes to two experts)")
    jitter = cfg.get("router_jitter_noise", 0.01)
    if not isinstance(jitter, (int, float)) or isinstance(jitter, bool) or jitter < 0:
        raise _refuse("router_jitter_noise", jitter, " (a non-negative number)")
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    short, long = rope.pop("short_mscale", None), rope.pop("long_mscale", None)
    if short != long:  # (transformers picks one by each forward pass's length)
        raise _refuse("rope_scaling.long_mscale", long, f" other than short_mscale ({short})")
    if short is not None:
        rope["attention_factor"] = short
    original = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings", 4096))
    scaling = rope_scaling(
        {**cfg, "rope_scaling": None, "original_max_position_embeddings": original},
        rope,
        fields["max_position_embeddings"],
    )
    window = cfg.get("sliding_window")
    return {
        "moe": MoEConfig(
            num_experts=experts,
            top_k=2,
            intermediate_size=fields["intermediate_size"],
            norm_topk_prob=False,
            sparsemixer_eps=float(jitter),
        ),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "lm_head_bias": bool(cfg.get("lm_head_bias", False)),
        "rope_scaling": scaling,
        "layer_windows": [int(window)] * fields["num_layers"] if window else None,
    }
