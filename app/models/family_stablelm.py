"""StableLM 2 / StableLM 3B / StableCode (stabilityai/stablelm-*: model_type stablelm), as transformers'
StableLmConfig reads its config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_stablelm): Llama's decoder layer and SiLU-gated MLP under LayerNorms with
biases (eps layer_norm_eps), biases on q, k and v where use_qkv_bias, the rope on the first partial_rotary_factor
of each head (rotate_half; StableLmConfig's default 0.25). The 12B's two switches are refused by name:
use_parallel_residual (attention and MLP side by side) and qk_layernorm (a LayerNorm per head of q and k).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.rope_config import with_default_partial
from lantern.app.models.spec import UnsupportedModelError

# StableLmConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304,
    "intermediate_size": 6912,
    "hidden_size": 2560,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a stablelm config; refuses, naming the key, what it does not compute."""
    if model_type != "stablelm":
        raise UnsupportedModelError(f"family_stablelm does not configure model_type {model_type!r}")
    check_silu(cfg, "StableLM")
    for key, what in (("use_parallel_residual", "attention and MLP side by side"), ("qk_layernorm", "per-head norms")):
        if cfg.get(key):
            raise refuse(key, cfg[key], f" ({what}: StableLM 2 12B)")
    rope = with_default_partial(cfg, fields["rope_scaling"], 0.25)  # (StableLmConfig's default)
    return {
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),  # (its LayerNorms' eps)
        "attention_bias": bool(cfg.get("use_qkv_bias", False)),
        "rope_scaling": rope,
    }
