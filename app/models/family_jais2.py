"""Jais 2 (inceptionai/Jais-2-*: model_type jais2), as transformers' Jais2Config reads its config.json (defaults
included), turned into ModelConfig fields.

The maths (transformers' modeling_jais2): Llama's decoder layer under LayerNorms with biases (eps layer_norm_eps),
attention with biases on q, k, v and o_proj (attention_bias, on by default), and Nemotron's ungated MLP,
down(relu(up(x))^2), with biases (mlp_bias, on by default).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# Jais2Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 150272,
    "hidden_size": 3328,
    "intermediate_size": 26624,
    "num_hidden_layers": 32,
    "num_attention_heads": 26,
    "max_position_embeddings": 8192,
    "attention_bias": True,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a jais2 config; refuses, naming the key, what it does not compute."""
    if model_type != "jais2":
        raise UnsupportedModelError(f"family_jais2 does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise refuse("hidden_act", act, "; Jais 2's ungated MLP is computed with relu2")
    return {
        "hidden_act": "relu2",
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),  # (its LayerNorms' eps)
        "attention_bias": bool(cfg.get("attention_bias", True)),
        "mlp_bias": bool(cfg.get("mlp_bias", True)),
    }
