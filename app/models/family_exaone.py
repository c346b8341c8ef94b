"""EXAONE 4.0 (model_type "exaone4": LGAI-EXAONE/EXAONE-4.0-32B, -1.2B): what its config.json means, as
transformers' Exaone4Config reads it, turned into ModelConfig fields.

The maths (transformers' modeling_exaone4): OLMo 2's decoder layer (no norm before the sublayers, each
sublayer's output normed before the residual add) around Llama's attention with per-head q/k RMSNorms
applied before the rope; with a sliding window, the sliding layers ("L" of sliding_window_pattern, or
layer_types) attend within it and rotate, the global layers ("G") apply no rope at all (NoPE); without
one every layer is global and rotates. One rope (llama3 scaling in the 32B) serves every rotating layer.
Backends: the olmo model files with ModelConfig.qk_norm (per-head) and rope_layers.

K-EXAONE (model_type "exaone_moe": LGAI-EXAONE/K-EXAONE-236B-A23B, ExaoneMoeConfig): the same attention in Llama's
pre-norm layer (OLMoE's), its MLPs past first_k_dense_replace (or where mlp_layer_types says) DeepSeek-V3's
mixture -- a sigmoid router choosing by score + e_score_correction_bias within groups, the chosen scores
renormalised and times routed_scaling_factor, num_shared_experts always-on experts beside; the multi-token-
prediction module (`mtp.*`) skipped. Backends: the llama_moe model files.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_attention_types, check_silu
from lantern.app.models.errors import refuse as _refuse


def _layer_types(cfg: dict[str, Any], num_layers: int) -> list[str]:
    """layer_types, else the pattern: an int n (every n-th layer global) or a string of L / G repeated."""
    types = cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("sliding_window_pattern", 4) if cfg.get("sliding_window", 4096) else 0
        if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
            types = [
                "sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(num_layers)
            ]
        elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
            types = [
                "sliding_attention" if pattern and (i + 1) % pattern else "full_attention" for i in range(num_layers)
            ]
        else:
            raise _refuse("sliding_window_pattern", pattern, " (a layer count or a string of L and G)")
    check_attention_types(types, num_layers)
    return list(types)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an exaone4 config.json (spec.ModelConfig.from_hf skips its
    Llama-family checks for configure families: the keys are checked here)."""
    if model_type not in ("exaone4", "exaone_moe"):
        raise UnsupportedModelError(f"family_exaone does not configure model_type {model_type!r}")
    check_silu(cfg, "EXAONE")
    num_layers = fields["num_layers"]
    window = cfg.get("sliding_window", 4096)
    types = _layer_types(cfg, num_layers)
    if model_type == "exaone_moe" and cfg.get("layer_types") is None and types and types[-1] != "full_attention":
        # (ExaoneMoeConfig's pattern makes the last layer global whatever it says; transformers' code reads no string)
        raise _refuse("sliding_window_pattern", cfg.get("sliding_window_pattern"), " (the last layer would slide)")
    sliding = [t == "sliding_attention" for t in types]
    if any(sliding) and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    rotates = [s or not window for s in sliding]  # with a window, the global layers are NoPE
    heads = fields["num_heads"]
    kv_heads = int(cfg.get("num_key_value_heads", 32) or heads)
    if heads % kv_heads:
        raise _refuse("num_key_value_heads", kv_heads, f" with num_attention_heads={heads} (not a divisor)")
    return {
        "num_kv_heads": kv_heads,
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
        "attention_bias": False,  # Exaone4Attention has no biases, whatever the config says
        "qk_norm": True,  # per head, before the rope
        "hidden_act": "silu",
        "layer_windows": [int(window) if s else None for s in sliding] if any(sliding) else None,
        "rope_layers": None if all(rotates) else tuple(rotates),
        **({"moe": _experts(cfg, num_layers)} if model_type == "exaone_moe" else {}),
    }


def _experts(cfg: dict[str, Any], num_layers: int) -> Any:
    """K-EXAONE's mixture as ExaoneMoeConfig states it (DeepSeek-V3's router under its own key names)."""
    from lantern.app.models.family_deepseek import DeepSeekMoEConfig
    from lantern.app.models.family_moe import mlp_kinds

    first = int(cfg.get("first_k_dense_replace", 1))
    kinds = mlp_kinds(cfg, num_layers, ["dense" if i < first else "sparse" for i in range(num_layers)])
    # the released config's is_moe_layer, which mlx_lm reads and transformers does not (a prediction layer's entry
    # may follow the stack's: only those are compared)
    stated = cfg.get("is_moe_layer")
    if stated is not None and (
        len(stated) < num_layers or [bool(x) for x in stated[:num_layers]] != [k == "sparse" for k in kinds]
    ):
        raise _refuse("is_moe_layer", stated, " (disagrees with first_k_dense_replace / mlp_layer_types)")
    for key, value in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):  # (mlx_lm reads them)
        if cfg.get(key, value) != value:
            raise _refuse(key, cfg[key], f" for exaone_moe (its router: {key}={value!r})")
    experts, top_k = int(cfg.get("num_experts", 64) or 0), int(cfg.get("num_experts_per_tok", 8))
    if experts == 0 or "sparse" not in kinds:
        return None
    groups, used = int(cfg.get("n_group", 1) or 1), int(cfg.get("topk_group", 1) or 1)
    if experts % groups or not 1 <= used <= groups or (groups > 1 and experts // groups < 2):
        raise _refuse("n_group", groups, f" with topk_group={used} and {experts} experts")
    if not 1 <= top_k <= used * (experts // groups):
        raise _refuse("num_experts_per_tok", top_k, f" (more than the experts routable among {experts})")
    inner = int(cfg.get("moe_intermediate_size", 1024))
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        router_weights_fp32=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=groups,
        topk_group=used,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 2.5)),
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        correction_bias=True,
        shared_size=int(cfg.get("num_shared_experts", 1) or 0) * inner,
    )


def checkpoint_name(name: str) -> str:
    """A K-EXAONE tensor under the model files' names: the router's bias (stored beside the gate) as DeepSeek's."""
    return name.replace(".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")
