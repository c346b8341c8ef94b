"""Ministral 3 (model_type "ministral3": mistralai/Ministral-3-*-2512, served alone or as the text
model of a Mistral3ForConditionalGeneration folder): what its config.json means, as transformers'
Ministral3Config reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_ministral3): Mistral's (Llama's) decoder with YaRN, plus one extra,
Llama 4's attention temperature: after the rope, each query is multiplied by

    1 + beta * log(1 + floor(position / original_max_position_embeddings))

with beta = rope_parameters.llama_4_scaling_beta and the length YaRN's original context
(rope_parameters.original_max_position_embeddings), so queries past each multiple of that length
weigh their scores a little more. Keys and values are untouched, so the paged cache is plain.
llama.cpp computes the same (its mistral3 graph: attention.temperature_scale = beta, the length its
YaRN original context). GGUF configs carry both as `llama_4_scaling` {beta, original_max_position_embeddings}
(the name Mistral's own params.json uses), built by gguf_config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# Ministral3Config's defaults where config.json leaves a key out (several differ from from_hf's).
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 131072,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 34,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
}
# Ministral3Config.__post_init__'s rope when config.json states none (rope_theta included).
_DEFAULT_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
_ACTIVATIONS = {"silu", "swish"}  # one function under two names in transformers' ACT2FN


@dataclass(frozen=True)
class AttnTemperature:
    """Llama 4's per-position query scale: q * (1 + beta * log(1 + floor((position + offset) / length)))."""

    beta: float
    length: int  # YaRN's original_max_position_embeddings: the scale steps up at each multiple
    offset: int = 0  # Llama 4's own layers count positions from one


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a ministral3 config (spec.ModelConfig.from_hf skips its
    Llama-family checks for configure families: the keys are checked here)."""
    if model_type != "ministral3":
        raise UnsupportedModelError(f"family_ministral does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise _refuse("hidden_act", act, "; Ministral 3's MLP is SiLU-gated")
    full = {key: cfg[key] if cfg.get(key) is not None else value for key, value in _DEFAULTS.items()}
    heads, kv_heads, head_dim = (int(full[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    if heads % kv_heads or head_dim % 2:
        raise UnsupportedModelError(
            f"num_attention_heads={heads}, num_key_value_heads={kv_heads}, head_dim={head_dim} in config.json "
            "are not implemented (query heads must be a multiple of KV heads, head_dim even)"
        )
    max_pos = int(full["max_position_embeddings"])
    # transformers 5 reads rope_parameters, else an older rope_scaling (with the top-level
    # rope_theta), else Ministral3Config's default YaRN.
    stated = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    rope = dict(stated) if stated else dict(_DEFAULT_ROPE)
    theta = float(rope.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    beta = rope.pop("llama_4_scaling_beta", None)
    rope.pop("max_position_embeddings", None)  # stated beside the rope; no initialiser reads it
    temperature = _temperature(beta, rope.get("original_max_position_embeddings"), cfg.get("llama_4_scaling"))
    window = cfg.get("sliding_window")  # MistralModel: one window for every layer when set
    return {
        "vocab_size": int(full["vocab_size"]),
        "hidden_size": int(full["hidden_size"]),
        "intermediate_size": int(full["intermediate_size"]),
        "num_layers": int(full["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(full["rms_norm_eps"]),
        "max_position_embeddings": max_pos,
        "rope_theta": theta,
        "rope_scaling": rope_scaling({"model_type": model_type, "rope_scaling": rope}, {}, max_pos),
        "attention_bias": False,  # Mistral's projections have no biases, whatever the config says
        "qk_norm": False,
        "hidden_act": "silu",
        "layer_windows": [int(window)] * int(full["num_hidden_layers"]) if window else None,
        "attn_temperature": temperature,
    }


def temperature_of(beta: Any, length: Any) -> AttnTemperature | None:
    """The query temperature of a rope_parameters' llama_4_scaling_beta and original length (Mistral 4 too)."""
    return _temperature(beta, length, None)


def _temperature(beta: Any, length: Any, gguf: dict[str, Any] | None) -> AttnTemperature | None:
    """The query temperature from rope_parameters' beta and original length, or from a GGUF
    config's llama_4_scaling; None when beta is absent or 0 (a scale of exactly 1)."""
    key = "rope_parameters.llama_4_scaling_beta"
    if gguf is not None:
        if beta is not None:
            raise _refuse(key, beta, " beside llama_4_scaling (two temperatures)")
        beta, length, key = gguf.get("beta"), gguf.get("original_max_position_embeddings"), "llama_4_scaling.beta"
    if beta is None or beta == 0:
        return None
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
        raise _refuse(key, beta, " (must be a number >= 0)")
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise _refuse(
            "rope_parameters.original_max_position_embeddings",
            length,
            " (the attention temperature's step length: a positive integer)",
        )
    return AttnTemperature(float(beta), length)


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text config inside a multimodal mistral3 config.json (Mistral3Config): its text_config
    (ministral3 for Ministral 3, mistral for Mistral Small 3.x), with the wrapper's tying
    (Mistral3ForConditionalGeneration ties lm_head to the embedding by the wrapper's
    tie_word_embeddings, default true, whatever text_config says) and its token ids and
    quantization where text_config lacks them."""
    from lantern.app.models.spec import wrapped_text_config

    model_type = (cfg.get("text_config") or {}).get("model_type", "mistral")  # Mistral3Config's default text model
    # the keys ModelConfig.from_hf requires, as Ministral3Config fills them
    defaults = _DEFAULTS if model_type == "ministral3" else None
    return wrapped_text_config(cfg, model_type, cfg.get("tie_word_embeddings", True), defaults)
