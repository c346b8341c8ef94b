"""Helium (kyutai/helium-1-*: model_type helium), as transformers' HeliumConfig reads its config.json (defaults
included), turned into ModelConfig fields.

The maths (transformers' modeling_helium): Llama's decoder layer, RMSNorms and SiLU-gated MLP, with the rope on
consecutive pairs of each head (its rotate_half takes x[0::2] / x[1::2]: ModelConfig.rope_interleaved), base 100000
by default; biases on q, k and v where attention_bias (none on o_proj). mlp_bias is refused.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# HeliumConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 48000,
    "hidden_size": 2560,
    "intermediate_size": 7040,
    "num_hidden_layers": 24,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-8,
    "rope_theta": 100000.0,  # HeliumConfig.default_theta
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a helium config; refuses, naming the key, what it does not compute."""
    if model_type != "helium":
        raise UnsupportedModelError(f"family_helium does not configure model_type {model_type!r}")
    check_silu(cfg, "Helium")
    if cfg.get("mlp_bias"):
        raise refuse("mlp_bias", True, " (biases on the MLP projections)")
    return {"rope_interleaved": True}
