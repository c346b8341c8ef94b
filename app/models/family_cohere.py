"""Cohere Command R7B / Command A (model_type "cohere2") and Command R / R+ / Aya 23 / Aya Expanse ("cohere"):
what their config.json means, as transformers' Cohere2Config / CohereConfig read it, turned into ModelConfig
fields.

The maths (transformers' modeling_cohere2): one LayerNorm per layer (mean-subtracted, weight only, in
float32) whose output feeds attention and MLP in parallel, both added to the residual stream; the rope
rotates consecutive pairs of each head and only on the sliding layers (layer_types; default three
sliding, then one global, window 4096) — the global layers apply no rope; logits times logit_scale;
embeddings tied by default. attention_bias would add biases to q/k/v and o_proj (refused: the released
models have none). The first generation ("cohere") is the same block with the rope on every layer, and
Command R+'s use_qk_norm: a LayerNorm over each head of q and k (a weight per head) before the rope.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_attention_types, check_silu
from lantern.app.models.errors import refuse as _refuse


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a cohere2 config.json (spec.ModelConfig.from_hf skips its
    Llama-family checks for configure families: the keys are checked here)."""
    if model_type not in ("cohere", "cohere2"):
        raise UnsupportedModelError(f"family_cohere does not configure model_type {model_type!r}")
    check_silu(cfg, "Cohere")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], f" for {model_type} (biases on q/k/v and o_proj)")
    if cfg.get("rotary_pct", 1.0) not in (None, 1, 1.0):  # transformers ignores it, llama.cpp honours it
        raise _refuse("rotary_pct", cfg["rotary_pct"], " (a partial rope: transformers and llama.cpp disagree)")
    if model_type == "cohere":  # (trained on 128k positions, model_max_length says; max_position_embeddings 8192)
        context = int(cfg.get("model_max_length") or cfg.get("max_position_embeddings", 8192))
        return {
            **_common(cfg, fields),
            "qk_norm": bool(cfg.get("use_qk_norm", False)),
            "max_position_embeddings": context,
        }
    num_layers = fields["num_layers"]
    types = cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("sliding_window_pattern", 4)
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
            raise _refuse("sliding_window_pattern", pattern, " (a positive layer count)")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    check_attention_types(types, num_layers)
    sliding = [t == "sliding_attention" for t in types]
    window = cfg.get("sliding_window", 4096)
    if any(sliding) and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    return {
        **_common(cfg, fields),
        "layer_windows": [int(window) if s else None for s in sliding] if any(sliding) else None,
        "rope_layers": None if all(sliding) else tuple(sliding),  # the global layers are NoPE
    }


def _common(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Both generations' fields: LayerNorm eps, tying, the logits' scale."""
    scale = cfg.get("logit_scale", 0.0625)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise _refuse("logit_scale", scale, " (a positive number)")
    heads = fields["num_heads"]
    return {
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),  # the LayerNorms' eps
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 8192)),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attention_bias": False,
        "hidden_act": "silu",
        "logits_divisor": 1.0 / float(scale),
    }
