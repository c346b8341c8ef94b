"""Arcee AFM (model_type "arcee": arcee-ai/AFM-4.5B): what its config.json means, as transformers' ArceeConfig
reads it, turned into ModelConfig fields.

The maths (transformers' modeling_arcee): Llama's decoder layer (its rope, YaRN for the long context) whose MLP
has no gate: down(relu(up(x))^2), Nemotron's (models/nemotron_h.Relu2MLP). llama.cpp's `arcee` GGUFs are
LlamaModel conversions (q/k rows permuted) with ffn_up / ffn_down only.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# ArceeConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 2560,
    "intermediate_size": 18432,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an arcee config; refuses, naming the key, what it does not compute."""
    if model_type != "arcee":
        raise UnsupportedModelError(f"family_arcee does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise refuse("hidden_act", act, "; Arcee's ungated MLP is computed with relu2")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):  # (LlamaAttention's would bias o_proj too)
            raise refuse(key, cfg[key], " for arcee (biases on the projections)")
    return {"hidden_act": "relu2"}
