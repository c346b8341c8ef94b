"""Xiaomi MiMo-V2-Flash (model_type "mimo_v2_flash": XiaomiMiMo/MiMo-V2-Flash), as transformers' MiMoV2FlashConfig
reads its config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_mimo_v2_flash): Laguna's model -- Llama's pre-norm layers of two types
(layer_types: the first and every sixth full, the rest sliding within sliding_window keys, the query included),
each type its own rope (rope_parameters nested by type: the full layers' base 5e6, the sliding layers' 1e4, both
turning int(head_dim * partial_rotary_factor) dims of each head, 0.334 of 192 by default) -- with Qwen2's attention
reshaped: q/k heads head_dim wide, value heads v_head_dim wide (narrower), the values times attention_value_scale,
the sliding layers holding twice num_key_value_heads and a learned sink logit per head. mlp_layer_types' dense
layers are a gated MLP, the sparse ones DeepSeek-V3's mixture (a float32 sigmoid router choosing by score +
e_score_correction_bias within n_group groups, the chosen scores renormalised with norm_topk_prob and scaled by
routed_scaling_factor; no shared experts). Its multi-token-prediction module (`model.mtp.*`) is skipped; the sinks
are stored as `self_attn.attention_sink_bias`.

The released config.json states what transformers' class fixes: hybrid_layer_pattern (1: a sliding layer) where
layer_types is absent, swa_num_key_value_heads (the sliding layers' K/V heads; transformers takes twice
num_key_value_heads, which they equal in the releases), swa_head_dim / swa_v_head_dim / swa_num_attention_heads
(refused unless equal to the full layers'), sliding_window_size (the window without the query: one less).

Each layer's K/V heads are the KV pool's per-layer shapes (ModelConfig.kv_shapes); the values are held padded to
head_dim there (ModelConfig.v_head_dim), a fifth of the pool's bytes more than their own width would take.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.family_laguna import typed_ropes
from lantern.app.models.family_moe import mlp_kinds
from lantern.app.models.family_olmo import typed_windows
from lantern.app.models.spec import UnsupportedModelError

_DEFAULT_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334},
}

# MiMoV2FlashConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 152576,
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 192,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a mimo_v2_flash config; refuses, naming the key, what it does not compute."""
    if model_type != "mimo_v2_flash":
        raise UnsupportedModelError(f"family_mimo_v2 does not configure model_type {model_type!r}")
    check_silu(cfg, "MiMo-V2-Flash")
    layers, heads, kv, head_dim = fields["num_layers"], fields["num_heads"], fields["num_kv_heads"], fields["head_dim"]
    v_dim = int(cfg.get("v_head_dim", 128))
    if not 0 < v_dim <= head_dim:
        raise refuse("v_head_dim", v_dim, f" (at most head_dim, {head_dim})")
    for key, same in (("swa_head_dim", head_dim), ("swa_v_head_dim", v_dim), ("swa_num_attention_heads", heads)):
        if cfg.get(key) is not None and int(cfg[key]) != same:
            raise refuse(key, cfg[key], f" (the sliding layers' differing from the full layers' {same})")
    default_types = ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention" for i in range(layers)]
    pattern = cfg.get("hybrid_layer_pattern")
    if pattern is not None and cfg.get("layer_types") is None:  # (the released configs')
        default_types = ["sliding_attention" if p == 1 else "full_attention" for p in pattern]
    window = cfg["sliding_window_size"] + 1 if cfg.get("sliding_window_size") is not None else None
    windows = typed_windows(
        {**cfg, "sliding_window": window or cfg.get("sliding_window", 129)}, layers, default_types, 129
    )
    swa_kv = int(cfg.get("swa_num_key_value_heads") or 2 * kv)
    kv_heads = tuple(kv if windows is None or windows[i] is None else swa_kv for i in range(layers))
    if any(heads % k for k in kv_heads):
        raise refuse("num_key_value_heads", kv, f" (the sliding layers hold twice as many: {heads} heads each)")
    stated = cfg.get("rope_parameters") or _DEFAULT_ROPE
    # (each type's factor defaults to 0.334 where unstated: MiMoV2FlashRotaryEmbedding's)
    nested = {k: {"partial_rotary_factor": 0.334, **v} if isinstance(v, dict) else v for k, v in stated.items()}
    cfg = {**cfg, "rope_parameters": nested}
    rope = typed_ropes(cfg, head_dim, windows, (5_000_000.0, 10_000.0), "mimo_v2_flash")
    scale = cfg.get("attention_value_scale", 0.707)
    return {
        "num_kv_heads": max(kv_heads),
        "kv_shapes": tuple((k, head_dim) for k in kv_heads) if len(set(kv_heads)) > 1 else None,
        "v_head_dim": v_dim if v_dim != head_dim else None,
        "attn_value_scale": 1.0 if scale is None else float(scale),
        "layer_windows": windows,
        "moe": _experts(cfg, layers),
        **rope,
    }


def checkpoint_name(name: str) -> str:
    """The released names as the model files': the sliding layers' sinks are stored as attention_sink_bias."""
    return name.replace(".self_attn.attention_sink_bias", ".self_attn.sinks")


def layer_kv_heads(cfg: Any, layer_idx: int) -> int:
    """The KV heads of one layer (the sliding layers' twice the full layers')."""
    return cfg.kv_shapes[layer_idx][0] if cfg.kv_shapes is not None else cfg.num_kv_heads


def _experts(cfg: dict[str, Any], layers: int) -> DeepSeekMoEConfig | None:
    kinds = mlp_kinds(cfg, layers, ["dense"] + ["sparse"] * (layers - 1))
    experts = int(cfg.get("n_routed_experts", cfg.get("num_local_experts", 256)) or 0)
    if experts == 0 or "sparse" not in kinds:
        return None
    top_k = int(cfg.get("num_experts_per_tok", 8))
    n_group, topk_group = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    if experts % n_group or experts // n_group < 2 or not 1 <= topk_group <= n_group:
        raise refuse("n_group", n_group, f" with topk_group={topk_group} and {experts} experts")
    if cfg.get("n_shared_experts"):  # (MiMoV2FlashConfig builds none)
        raise refuse("n_shared_experts", cfg["n_shared_experts"], " for mimo_v2_flash")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 2048)),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        router_weights_fp32=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        correction_bias=True,
    )
