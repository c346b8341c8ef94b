"""StarCoder2 (bigcode/starcoder2-3b / 7b / 15b and their instruct tunes: model_type starcoder2), as transformers'
Starcoder2Config reads its config.json (defaults included), turned into ModelConfig fields for the Jais 2 model
files (backends/*/models/jais2.py: the same layer).

The maths (transformers' modeling_starcoder2): Llama's decoder layer under LayerNorms with biases (eps
norm_epsilon), attention with biases on q, k, v and o_proj and an ungated MLP, c_proj(gelu_tanh(c_fc(x))), with
biases (use_bias, on by default, switches every bias); a sliding window on every layer where sliding_window is
set; the head tied to the embedding by default.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# Starcoder2Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 3072,
    "intermediate_size": 12288,
    "num_hidden_layers": 30,
    "num_attention_heads": 24,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh"}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a starcoder2 config; refuses, naming the key, what it does not compute."""
    if model_type != "starcoder2":
        raise UnsupportedModelError(f"family_starcoder2 does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise refuse("hidden_act", act, f"; supported: {', '.join(_ACTIVATIONS)}")
    bias = bool(cfg.get("use_bias", True))
    window = cfg.get("sliding_window")
    return {
        "hidden_act": _ACTIVATIONS[act],
        "rms_norm_eps": float(cfg.get("norm_epsilon", 1e-5)),  # (its LayerNorms' eps)
        "attention_bias": bias,
        "mlp_bias": bias,
        "layer_windows": [int(window)] * fields["num_layers"] if window else None,
    }


def checkpoint_name(name: str) -> str:
    """A StarCoder2 tensor name in the model files' terms: its MLP's c_fc / c_proj are up_proj / down_proj."""
    return name.replace(".mlp.c_fc.", ".mlp.up_proj.").replace(".mlp.c_proj.", ".mlp.down_proj.")
