"""Nemotron (NVIDIA's Nemotron-3 8B, Nemotron-Mini-4B, Minitron-4B / 8B: model_type nemotron), as transformers'
NemotronConfig reads its config.json (defaults included), turned into ModelConfig
fields for the Jais 2 model files (backends/*/models/jais2.py: the same layer).

The maths (transformers' modeling_nemotron): Llama's decoder layer under LayerNorm1P (a LayerNorm with a bias
whose scale is 1 + weight; eps norm_eps), attention (biases where attention_bias) with the rope on the first
partial_rotary_factor of each head (rotate_half; NemotronConfig's default 0.5), and an ungated MLP,
down(relu(up(x))^2) (biases where mlp_bias). The 1 is added to the norms' weights as they load
(checkpoint_tensors), so the model files' plain LayerNorm computes LayerNorm1P; GGUF files store 1 + w
(llama.cpp's NemotronModel), which the GGUF reader takes back to w first (gguf_arch.NORM_PLUS_ONE).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.rope_config import with_default_partial
from lantern.app.models.spec import UnsupportedModelError

# NemotronConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 6144,
    "intermediate_size": 24576,
    "num_hidden_layers": 32,
    "num_attention_heads": 48,
    "max_position_embeddings": 4096,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a nemotron config; refuses, naming the key, what it does not compute."""
    if model_type != "nemotron":
        raise UnsupportedModelError(f"family_nemotron does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise refuse("hidden_act", act, "; Nemotron's ungated MLP is computed with relu2")
    rope = with_default_partial(cfg, fields["rope_scaling"], 0.5)  # (NemotronConfig's default)
    return {
        "hidden_act": "relu2",
        "rms_norm_eps": float(cfg.get("norm_eps", 1e-5)),  # (its LayerNorms' eps)
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "rope_scaling": rope,
    }


def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """LayerNorm1P's scale, 1 + weight, as the LayerNorms' weights (added in float32: one rounding, as a
    float32 model computes it; a numpy array, as the GGUF reader yields, whatever the framework)."""
    from lantern.app.models.quant.affine import float32_array

    for name, value in source:
        if name.endswith("norm.weight"):
            value = float32_array(value) + 1.0
        yield name, value
