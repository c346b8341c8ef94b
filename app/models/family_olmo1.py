"""OLMo (1) (allenai/OLMo-1B-hf / 7B-hf / OLMo-1.7-7B-hf: model_type olmo), as transformers' OlmoConfig reads its
config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_olmo): Llama's decoder layer and SiLU-gated MLP under LayerNorms with no weight
or bias (eps 1e-5, in float32), and q, k and v each clamped to [-clip_qkv, clip_qkv] after their projections where
clip_qkv is set (OLMo 1.7). attention_bias (biases on q, k, v and the output projection; no released checkpoint
sets it) is refused.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# OlmoConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an olmo config; refuses, naming the key, what it does not compute."""
    if model_type != "olmo":
        raise UnsupportedModelError(f"family_olmo1 does not configure model_type {model_type!r}")
    check_silu(cfg, "OLMo")
    if cfg.get("attention_bias"):
        raise refuse("attention_bias", True, " for olmo (biases on q, k, v and o_proj)")
    clip = cfg.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip <= 0):
        raise refuse("clip_qkv", clip, " (must be a positive number)")
    return {
        "rms_norm_eps": 1e-5,  # (OlmoLayerNorm's, fixed)
        "attention_bias": False,
        "clip_qkv": None if clip is None else float(clip),
    }
