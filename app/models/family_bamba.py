"""Bamba (IBM's Bamba-9B; model_type "bamba"): what its config.json means, as transformers' BambaConfig reads
it, turned into ModelConfig fields for the Granite 4.0-H model files (backends/*/models/granite_hybrid.py).

Bamba is Granite 4.0-H's forerunner and the same block: RMSNorm, then a Mamba-2 mixer (family_mamba2, the same
mamba_* keys, its grouped gated norm) or attention at attn_layer_indices, the residual add, RMSNorm, a dense
SiLU-gated MLP (`feed_forward`, under `pre_ff_layernorm`: the model files' shared_mlp and
post_attention_layernorm). What differs: no Granite scalars (query scale head_dim ** -0.5), and its attention
always rotates half of each head (BambaConfig sets partial_rotary_factor 0.5 whatever config.json says).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_silu
from lantern.app.models.errors import refuse as _refuse

# BambaConfig's defaults for the keys ModelConfig.from_hf requires (its released config states them all).
DEFAULTS = {
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a bamba config.json."""
    from lantern.app.models.family_mamba2 import mixer_config

    if model_type != "bamba":
        raise UnsupportedModelError(f"family_bamba does not configure model_type {model_type!r}")
    check_silu(cfg, "Bamba")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " for bamba (biases on the projections)")
    layers = fields["num_layers"]
    attention = cfg.get("attn_layer_indices") or []
    if not attention or any(not 0 <= int(i) < layers for i in attention):
        raise _refuse("attn_layer_indices", attention, f" (attention layers among the {layers}; none: no KV at all)")
    mamba = mixer_config(cfg, fields["hidden_size"], tuple(i not in attention for i in range(layers)))
    stated = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5)
    if stated != 0.5:  # (transformers overrides it with 0.5: refuse rather than serve a number it ignores)
        raise _refuse("rope_parameters.partial_rotary_factor", stated, " (Bamba rotates half of each head)")
    rope = dict(fields["rope_scaling"] or {"rope_type": "default"})
    return {
        "mamba": mamba,
        "rope_scaling": {**rope, "partial_rotary_factor": 0.5},
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 262144)),
    }


def checkpoint_name(name: str) -> str:
    """A Bamba tensor name in the Granite 4.0-H model files' terms (its final norm is final_layernorm)."""
    if name.startswith("model.final_layernorm."):
        return "model.norm." + name.removeprefix("model.final_layernorm.")
    return name.replace(".feed_forward.", ".shared_mlp.").replace(".pre_ff_layernorm.", ".post_attention_layernorm.")
