"""CWM (Meta's Code World Model, facebook/cwm: model_type cwm), as transformers' CwmConfig reads its config.json
(defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_cwm): Llama's decoder layer without biases whose layers alternate sliding and
full attention (layer_types; default: every 4th layer from the first full, the others within sliding_window
8192), under a llama3-scaled rope (default: base 1e6, factor 16 from 8192).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_attention_types, check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# CwmConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 6144,
    "intermediate_size": 21504,
    "num_hidden_layers": 64,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
}
_ROPE = {  # CwmConfig's rope when config.json states none
    "rope_type": "llama3",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a cwm config; refuses, naming the key, what it does not compute."""
    if model_type != "cwm":
        raise UnsupportedModelError(f"family_cwm does not configure model_type {model_type!r}")
    check_silu(cfg, "CWM")
    if cfg.get("mlp_bias"):
        raise _refuse("mlp_bias", cfg["mlp_bias"], " (biases on the MLP projections)")
    layers = fields["num_layers"]
    types = cfg.get("layer_types") or ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)]
    check_attention_types(types, layers)
    window = cfg.get("sliding_window", 8192)
    if "sliding_attention" in types and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    windows = [int(window) if t == "sliding_attention" else None for t in types]
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or _ROPE)
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or _ROPE["rope_theta"])
    return {
        "attention_bias": False,  # (CwmConfig has no such key: Qwen2's attention without its biases)
        "layer_windows": windows if any(windows) else None,
        "rope_theta": theta,
        "rope_scaling": rope_scaling({**cfg, "rope_scaling": None}, rope, fields["max_position_embeddings"]),
    }
