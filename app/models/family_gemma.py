"""Gemma (1), Gemma 2 and Gemma 3 (text): what their config.json means, as transformers' GemmaConfig /
Gemma2Config / Gemma3TextConfig read it (defaults included), turned into ModelConfig fields.

The maths these fields switch on: RMSNorm scaled by (1 + weight) in float32, embeddings times
sqrt(hidden_size) rounded to the model dtype, GeGLU (tanh GELU), query scale
query_pre_attn_scalar ** -0.5, sandwich norms, attention soft-capping (Gemma 2 only: Gemma 3's
attention ignores attn_logit_softcapping), final logit soft-capping, interleaved sliding/full
layers, and Gemma 3's own rope for the sliding layers.

Also here, for the multimodal Gemma 3 folders (model_type "gemma3"): text_config_of() and
text_weight_name() say which part of such a folder is the text model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# transformers' defaults where config.json leaves a key out (Gemma2Config / Gemma3TextConfig).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 8192,
        "sliding_pattern": 2,
    },
    "vaultgemma": {  # VaultGemmaConfig is Gemma2Config's (its layers without the sandwich's outer norms)
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 8192,
        "sliding_pattern": 2,
    },
    "gemma3_text": {
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "max_position_embeddings": 131072,
        "sliding_pattern": 6,
    },
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh"}  # ACT2FN name -> the shared MLP's
_LAYER_TYPES = ("sliding_attention", "full_attention")
_GLOBAL_THETA, _LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a gemma / gemma2 / gemma3_text config (spec.ModelConfig.from_hf)."""
    if model_type == "gemma":
        return _gemma1(cfg)
    defaults = _DEFAULTS[model_type]
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise _refuse("hidden_activation", act, f"; supported: {', '.join(_ACTIVATIONS)}")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on q/k/v and o_proj)")
    bidirectional = bool(cfg.get("use_bidirectional_attention"))
    if bidirectional and model_type != "gemma3_text":
        raise _refuse("use_bidirectional_attention", True, f" for {model_type} (Gemma 3's EmbeddingGemma only)")
    num_layers = fields["num_layers"]
    out: dict[str, Any] = {
        "hidden_act": _ACTIVATIONS[act],
        # transformers' Gemma configs default head_dim to 256, not hidden_size // heads.
        "head_dim": cfg.get("head_dim") or 256,
        "layer_windows": _windows(cfg, num_layers, defaults["sliding_pattern"]),
        "attn_scale": float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
        "final_softcap": _cap(cfg.get("final_logit_softcapping", defaults["final_logit_softcapping"])),
        "norm_offset": True,
        "embed_scale": True,
        "sandwich_norms": True,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "max_position_embeddings": cfg.get("max_position_embeddings", defaults["max_position_embeddings"]),
    }
    if model_type in ("gemma2", "vaultgemma"):
        out["attn_softcap"] = _cap(cfg.get("attn_logit_softcapping", defaults["attn_logit_softcapping"]))
        out["sandwich_norms"] = model_type == "gemma2"  # VaultGemma: no norm after attention nor after the MLP
        return out
    # Gemma 3: q/k norms, no attention soft-capping (its attention never passes the cap on), and
    # one rope per layer type.
    out["qk_norm"] = True
    out["attn_softcap"] = None
    out.update(_gemma3_rope(cfg, out["max_position_embeddings"]))
    if bidirectional:  # EmbeddingGemma: an encoder (embeddings only) on Gemma 3's layers
        if out["rope_scaling"]:
            raise _refuse("rope_parameters.full_attention", out["rope_scaling"], " with use_bidirectional_attention")
        windows = out["layer_windows"] or [None] * num_layers
        half = int(cfg.get("sliding_window", 512)) // 2  # transformers: |q - k| < sliding_window // 2 + 1
        out.update(family="gemma_encoder", encoder=BidirectionalGemma(half, tuple(w is not None for w in windows)))
        out.update(tie_word_embeddings=True, eos_token_ids=[])  # (no head: the embedding is never a head here)
    return out


@dataclass(frozen=True)
class BidirectionalGemma:
    """EmbeddingGemma (gemma3_text with use_bidirectional_attention): every query attends both ways; a sliding
    layer's keys lie within half_window positions of it (transformers' _bidirectional_window_overlay)."""

    half_window: int
    local: tuple[bool, ...]  # per layer: a sliding layer
    matrices_per_layer: int = 7  # q, k, v, o, gate, up, down (isq_candidates)


def _gemma1(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma (1) / CodeGemma: Llama's layer under (1 + w) norms, GeGLU and the scaled embedding, query scale
    head_dim ** -0.5; its rope is Llama's (spec's rope_scaling). GemmaConfig reads hidden_act, taking the
    released configs' "gelu" as the tanh approximation it was trained with."""
    act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu", "gelu_pytorch_tanh"):
        raise _refuse("hidden_act", act, "; supported: gelu_pytorch_tanh (and gelu, read as it)")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on q/k/v and o_proj)")
    if cfg.get("use_bidirectional_attention"):
        raise _refuse("use_bidirectional_attention", cfg["use_bidirectional_attention"], " (non-causal attention)")
    head_dim = cfg.get("head_dim") or 256
    return {
        "hidden_act": "gelu_tanh",
        "head_dim": head_dim,
        "attn_scale": float(head_dim) ** -0.5,
        "norm_offset": True,
        "embed_scale": True,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "max_position_embeddings": cfg.get("max_position_embeddings", 8192),
    }


def checkpoint_name(name: str) -> str:
    """A Gemma (1) tensor name in the model files' terms: its pre-MLP norm is Llama's post_attention_layernorm
    (Gemma 2's names it pre_feedforward_layernorm; the model files use that name for both)."""
    return name.replace(".post_attention_layernorm.", ".pre_feedforward_layernorm.")


def _cap(value: Any) -> float | None:
    return float(value) if value else None


def _windows(cfg: dict[str, Any], num_layers: int, pattern: int) -> list[int | None] | None:
    """Per layer window from layer_types (default: every `pattern`-th layer full, the rest sliding;
    Gemma 3's pattern comes from sliding_window_pattern)."""
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        pattern = int(cfg.get("sliding_window_pattern") or pattern)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    bad = [t for t in layer_types if t not in _LAYER_TYPES]
    if bad or len(layer_types) != num_layers:
        raise _refuse("layer_types", bad[0] if bad else layer_types, f" (expected {num_layers} of {_LAYER_TYPES})")
    if "sliding_attention" not in layer_types:
        return None
    window = cfg.get("sliding_window", 4096)
    if not window:  # transformers raises on sliding layers without a window
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    return [int(window) if t == "sliding_attention" else None for t in layer_types]


def _gemma3_rope(cfg: dict[str, Any], max_pos: int) -> dict[str, Any]:
    """rope_theta / rope_scaling of the full layers and the plain rope base of the sliding ones,
    from transformers 5's rope_parameters nested by layer type or the older flat keys
    (rope_theta, rope_scaling, rope_local_base_freq): Gemma3TextConfig.convert_rope_params_to_dict."""
    params = dict(cfg.get("rope_parameters") or {})
    flat = sorted(k for k in params if k not in _LAYER_TYPES)
    if flat:  # transformers ignores a flat dict here: refuse rather than guess which layers it meant
        raise _refuse(f"rope_parameters.{flat[0]}", params[flat[0]], " (Gemma 3 nests rope_parameters by layer type)")
    full = dict(params.get("full_attention") or {})
    full.update(cfg.get("rope_scaling") or {})
    full.setdefault("rope_theta", cfg.get("rope_theta", _GLOBAL_THETA))
    local = dict(params.get("sliding_attention") or {})
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", _LOCAL_THETA))
    local_type = local.get("rope_type") or local.get("type") or "default"
    if local_type != "default":
        raise _refuse("rope_parameters.sliding_attention.rope_type", local_type, " (the sliding layers' rope is plain)")
    return {
        "rope_theta": float(full["rope_theta"]),
        "rope_scaling": rope_scaling({}, full, max_pos),
        "local_rope_theta": float(local["rope_theta"]),
    }


# ---- multimodal Gemma 3 folders (Gemma3ForConditionalGeneration) ------------------------------
# The text model of such a folder is an ordinary gemma3_text model: its config is text_config and
# its weights are the language model's (vision tower and projector are skipped).
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),  # transformers >= 4.52
    ("language_model.model.", "model."),  # checkpoints saved before (google/gemma-3-*-it)
    ("model.text_model.", "model."),  # Idefics3 / SmolVLM
    ("language_model.lm_head.", "lm_head."),
    ("lm_head.", "lm_head."),
)


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The gemma3_text config inside a multimodal gemma3 config.json, as Gemma3Config builds it (the
    wrapper ties, by default yes); Gemma3ForConditionalGeneration never soft-caps its logits (shipped
    configs say null anyway)."""
    from lantern.app.models.spec import wrapped_text_config

    text = wrapped_text_config(cfg, "gemma3_text", cfg.get("tie_word_embeddings", True), _GEMMA3_TEXT_DEFAULTS)
    text["final_logit_softcapping"] = None
    return text


# Gemma3TextConfig's defaults for the keys ModelConfig.from_hf requires (shipped text_configs omit some).
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}


def text_weight_name(name: str) -> str | None:
    """The language model's name of a vision-language checkpoint's tensor (gemma3, mistral3, qwen3_5,
    qwen3_5_moe, lfm2_vl: transformers' model.language_model.*, older language_model.model.*); None
    for the rest (the vision tower, projectors, multi-token prediction)."""
    for prefix, replacement in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix) :]
    return None
