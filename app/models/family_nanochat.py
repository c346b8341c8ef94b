"""NanoChat (model_type "nanochat": the models Karpathy's nanochat trains, as transformers' NanoChatConfig reads
them): what its config.json means, turned into ModelConfig fields.

The maths (transformers' modeling_nanochat): Llama's pre-norm layer where every RMSNorm has no weight (float32,
x / rms(x)), the embedding normed so before the first layer; the rope turned the other way round (its rotate_half
is negated: ModelConfig.rope_reversed), then per-head q/k norms after it (qk_norm_after_rope); an ungated relu^2
MLP (fc1, fc2); the logits soft-capped at final_logit_softcapping. Backends: models/nanochat.py.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# NanoChatConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304,
    "hidden_size": 768,
    "intermediate_size": 8192,
    "num_hidden_layers": 12,
    "num_attention_heads": 6,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a nanochat config; refuses, naming the key, what it does not compute."""
    if model_type != "nanochat":
        raise UnsupportedModelError(f"family_nanochat does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise refuse("hidden_act", act, "; NanoChat's ungated MLP is computed with relu2")
    if cfg.get("attention_bias"):
        raise refuse("attention_bias", cfg["attention_bias"], " for nanochat (biases on the projections)")
    cap = cfg.get("final_logit_softcapping", 15.0)
    return {
        "hidden_act": "relu2",
        "qk_norm": True,
        "qk_norm_after_rope": True,
        "rope_reversed": True,
        "embed_norm": True,
        "final_softcap": float(cap) if cap else None,
    }


def checkpoint_name(name: str) -> str:
    """A NanoChat tensor under the model files' names (its MLP's fc1 / fc2 as up_proj / down_proj)."""
    return name.replace(".mlp.fc1.", ".mlp.up_proj.").replace(".mlp.fc2.", ".mlp.down_proj.")
