"""OLMo 2 and OLMo 3 (model_type "olmo2" / "olmo3": allenai/OLMo-2-*, Olmo-3-*): what their config.json
means, as transformers' Olmo2Config / Olmo3Config read it (defaults included), turned into ModelConfig
fields.

The maths (transformers' modeling_olmo2 / olmo3): Llama's attention and MLP with the norms moved —
no norm before the sublayers; each sublayer's output is normed (post_attention_layernorm,
post_feedforward_layernorm) before it joins the residual stream — and q/k RMSNorms over the whole
projection (all heads at once, weights [heads * head_dim]), applied before the rope. OLMo 3 adds
sliding-window layers (layer_types; default three sliding, then one full, window 4096) with a rope of
their own: rope_parameters nested by layer type, the full layers' possibly scaled (YaRN for the long
context), the sliding layers' plain (Gemma 3's arrangement: ModelConfig.local_rope_theta).

OLMoE (model_type "olmoe": allenai/OLMoE-1B-7B-*): Llama's pre-norm layer with those whole-projection q/k
norms, every MLP a mixture of experts (each intermediate_size wide) under Qwen2-MoE's softmax router: the
top-k probabilities, renormalised only with norm_topk_prob (family_moe's routing).

FlexOlmo (model_type "flex_olmo": allenai/FlexOlmo-7x7B-1T, -RT): OLMo 2's layer (post-sublayer norms, Olmo2Attention)
with OLMoE's experts and router in place of the MLP.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.rope_config import rope_scaling

_LAYER_TYPES = ("sliding_attention", "full_attention")
_OLMO3_THETA = 500000.0  # Olmo3Config.default_theta


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an olmo2 / olmo3 / olmoe / flex_olmo config.json (spec.ModelConfig.from_hf
    skips its Llama-family checks for configure families: the keys are checked here)."""
    if model_type not in ("olmo2", "olmo3", "olmoe", "flex_olmo"):
        raise UnsupportedModelError(f"family_olmo does not configure model_type {model_type!r}")
    check_silu(cfg, "OLMo")
    if model_type == "olmoe" and cfg.get("clip_qkv") is not None:  # OlmoeAttention clamps q, k and v
        raise _refuse("clip_qkv", cfg["clip_qkv"], " for olmoe (q/k/v clamped)")
    # (clip_qkv, OLMo 1's, is no Olmo2Config key: transformers ignores it, so does Lantern)
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], f" for {model_type}")
    out: dict[str, Any] = {
        "num_kv_heads": int(cfg.get("num_key_value_heads") or fields["num_heads"]),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),  # Olmo3Config inherits it
        "hidden_act": "silu",
    }
    if model_type in ("olmoe", "flex_olmo"):
        out["moe"] = _olmoe_experts(cfg)
    if model_type == "olmo3":
        num_layers = fields["num_layers"]
        out["layer_windows"] = _olmo3_windows(cfg, num_layers)
        out.update(layer_type_rope(cfg, out["max_position_embeddings"]))
        if out["layer_windows"] is None:
            out["local_rope_theta"] = None  # no sliding layer: one rope
    return out


def _olmoe_experts(cfg: dict[str, Any]) -> MoEConfig:
    experts, top_k = int(cfg.get("num_experts", 64)), int(cfg.get("num_experts_per_tok", 8))
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("intermediate_size", 2048)),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
    )


def _olmo3_windows(cfg: dict[str, Any], num_layers: int) -> list[int | None] | None:
    default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(num_layers)]
    return typed_windows(cfg, num_layers, default, 4096)


def typed_windows(
    cfg: dict[str, Any], num_layers: int, default_types: list[str], default_window: int
) -> list[int | None] | None:
    """Each layer's window from layer_types (sliding_attention / full_attention; the config class's default types
    where absent) and sliding_window; None when no layer slides. (OLMo 3, Mellum, Laguna.)"""
    types = cfg.get("layer_types") or default_types
    if len(types) != num_layers or set(types) - set(_LAYER_TYPES):
        raise _refuse("layer_types", types, f" (one of {', '.join(_LAYER_TYPES)} for each of {num_layers} layers)")
    window = cfg.get("sliding_window", default_window)
    if "sliding_attention" not in types:
        return None
    if not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    return [int(window) if t == "sliding_attention" else None for t in types]


def layer_type_rope(
    cfg: dict[str, Any],
    max_pos: int,
    full_theta: float = _OLMO3_THETA,
    local_theta: float = _OLMO3_THETA,
    model_type: str = "olmo3",
    legacy: bool = True,
) -> dict[str, Any]:
    """The full layers' rope (theta, scaling) and the sliding layers' plain base, as Olmo3Config (and Mellum's,
    Laguna's: Gemma 3's arrangement) read them: rope_parameters nested by layer type, the bases defaulting to the
    config class's. legacy (OLMo 3): a top-level rope_scaling and rope_theta go to the full layers; without it (the
    config classes that drop them) they are refused / ignored as transformers does. A flat rope_parameters (which
    transformers ignores here) is refused rather than guessed; so is a sliding layers' partial rope (handled by the
    caller where the family has one)."""
    params = dict(cfg.get("rope_parameters") or {})
    flat = sorted(k for k in params if k not in _LAYER_TYPES)
    if flat:
        raise _refuse(f"rope_parameters.{flat[0]}", params[flat[0]], " (rope_parameters nest by layer type here)")
    if not legacy and cfg.get("rope_scaling"):  # (transformers drops it: its rope would not build)
        raise _refuse("rope_scaling", cfg["rope_scaling"], f" for {model_type} (rope_parameters nest by layer type)")
    if params and "sliding_attention" not in params and "sliding_attention" in (cfg.get("layer_types") or []):
        raise _refuse("rope_parameters", params, " (no sliding_attention rope for the sliding layers)")
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    full.update((cfg.get("rope_scaling") or {}) if legacy else {})
    full.setdefault("rope_theta", cfg.get("rope_theta", full_theta) if legacy else full_theta)
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", local_theta)
    local_type = local.get("rope_type") or local.get("type") or "default"
    if local_type != "default":
        raise _refuse("rope_parameters.sliding_attention.rope_type", local_type, " (the sliding layers' rope is plain)")
    return {
        "rope_theta": float(full["rope_theta"]),
        "rope_scaling": rope_scaling({"model_type": model_type, "head_dim": cfg.get("head_dim")}, full, max_pos),
        "local_rope_theta": float(local["rope_theta"]),
    }
