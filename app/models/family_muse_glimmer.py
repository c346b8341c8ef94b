"""Meta's Muse Glimmer (model_type "muse_glimmer": its language model, "muse_glimmer_text"; mlx-community's flat
text-only conversions keep "muse_glimmer"), as transformers' MuseGlimmerTextConfig reads it, turned into ModelConfig
fields for the model files (backends/*/models/muse_glimmer.py, Gemma's layer files underneath).

The maths (transformers' modeling_muse_glimmer): the token embedding normed by a weightless RMSNorm; Gemma 2/3's
sandwich layer -- four RMSNorms scaled by (1 + weight) in float32, those after attention and after the MLP with
post_norm_eps -- around attention whose q and k are normed by a weightless RMSNorm over each head, q then times
qk_scale_factor (folded into the query scale: head_dim ** -0.5 x qk_scale_factor), its output times
sigmoid(gate_proj(x)) per channel before o_proj; sliding layers (sliding_window) rotate, the full ones (every 4th
counted back from the last) are NoPE; a SiLU-gated MLP; a plain weighted RMSNorm at the end; the logits times
output_multiplier, then soft-capped at final_logit_softcapping. transformers rotates every rotating layer with the
global base: a layer_rope_theta stating another base is refused.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# MuseGlimmerTextConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 202_048,
    "hidden_size": 6656,
    "intermediate_size": 19968,
    "num_hidden_layers": 52,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a muse_glimmer_text config; refuses, naming the key, what it does not compute."""
    if model_type not in ("muse_glimmer_text", "muse_glimmer"):
        raise UnsupportedModelError(f"family_muse_glimmer does not configure model_type {model_type!r}")
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "silu"))
    if act not in ("silu", "swish"):
        raise refuse("hidden_activation", act, " (SiLU)")
    if cfg.get("attention_bias"):
        raise refuse("attention_bias", cfg["attention_bias"], " (biases on the projections)")
    layers = fields["num_layers"]
    types = cfg.get("layer_types") or [
        "full_attention" if (layers - 1 - i) % 4 == 0 else "sliding_attention" for i in range(layers)
    ]
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise refuse("layer_types", types, f" (full_attention or sliding_attention for each of the {layers} layers)")
    theta = fields["rope_theta"]
    thetas = cfg.get("layer_rope_theta") or [0 if t == "full_attention" else theta for t in types]
    if len(thetas) != layers or any(float(t) not in (0.0, theta) for t in thetas):
        raise refuse("layer_rope_theta", thetas, f" (0 for NoPE or the rope's base {theta} per layer)")
    window = cfg.get("sliding_window", 2048)
    mult, cap = float(cfg.get("output_multiplier", 0.19611613513818404)), cfg.get("final_logit_softcapping", 20.0)
    return {
        "layer_windows": [int(window) if t == "sliding_attention" and window else None for t in types],
        "rope_layers": tuple(float(t) != 0.0 for t in thetas),
        "attn_scale": fields["head_dim"] ** -0.5 * float(cfg.get("qk_scale_factor", 3.87)),
        "attn_output_gate": "sigmoid",
        "qk_norm": True,
        "sandwich_norms": True,
        "embed_norm": True,
        "post_norm_eps": float(cfg.get("post_norm_eps", 1e-8)),
        "logits_divisor": 1.0 / mult,
        "final_softcap": float(cap) if cap else None,
    }
