"""LFM3 (Liquid AI's LFM3-1.7B, model_type "lfm3"): what its config.json means, as transformers' Lfm3Config reads it
(defaults included), turned into ModelConfig fields. The layers are LFM2's (family_lfm2: the short convolutions, the
names read as Llama's, the model files backends/*/models/lfm2.py) with what transformers 5's Lfm3ForCausalLM adds:

- Three layer types (layer_types; Lfm3Config's default: full attention at i % 4 == 2, sliding at i % 4 == 0 past
  layer 0, the rest "conv"): sliding layers attend within sliding_window keys (ModelConfig.layer_windows, one entry
  per layer, None for conv and full layers; attention_config gives the attention layers theirs by pool layer).
- A rope per attention type (rope_parameters nested by type; each type's own only where the type is present). The
  sliding layers' is plain (ModelConfig.local_rope_theta over the whole head); the full layers' is the model's rope
  (rope_theta, rope_scaling): plain, or "proportional" -- Gemma 4's: the first int(partial_rotary_factor *
  head_dim // 2) pairs turn by base ** (-2i / head_dim) / factor, the others by 0, rotate_half over the whole head.
  A plain rope ignores partial_rotary_factor and factor, as transformers' default initialiser does.
- Qwen3's attention (per-head q/k RMSNorms before the rope), attention_bias on q/k/v/o, and with use_attention_gate
  each head's output times sigmoid(g_proj(x)) of the attention's input (attn_output_gate "sigmoid_head").
- use_sandwich_norm: RMSNorms on the operator's (conv or attention) and the MLP's outputs before each residual add
  (post_operator_norm, post_ffn_norm; ModelConfig.sandwich_norms).
- Lfm2MoeMLP's SwiGLU (w1 / w3 / w2) as wide as intermediate_size: LFM2's block_* width keys and full_attn_idxs are
  not read by Lfm3Config, so not here either. norm_eps is also read as rms_norm_eps (which wins where both are).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_gemma4 import proportional_inv_freq
from lantern.app.models.family_lfm2 import ShortConvConfig

if TYPE_CHECKING:
    from lantern.app.models.spec import ModelConfig

_TYPES = ("conv", "sliding_attention", "full_attention")
_LEGACY_TYPES = {"attention": "full_attention"}  # transformers' remap_legacy_layer_types
_THETA = 1_000_000.0  # Lfm3Config.default_theta: a rope entry's base where it states none

# Lfm3Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128_000,
    "hidden_size": 2048,
    "intermediate_size": 7680,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 128_000,
    "tie_word_embeddings": True,
    "pad_token_id": 124_893,
    "bos_token_id": 124_894,
    "eos_token_id": 124_900,
}
# Lfm3Config.__post_init__'s rope_parameters when config.json states none
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
}


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config inside an LFM3-VL config.json (Lfm3VlConfig: the wrapper ties, by default yes;
    its token ids and quantization apply when text_config lacks them)."""
    from lantern.app.models.spec import wrapped_text_config

    return wrapped_text_config(cfg, "lfm3", cfg.get("tie_word_embeddings", True))


def layer_types(cfg: dict[str, Any], n: int) -> list[str]:
    """Each layer's type as Lfm3Config states it (its default pattern where config.json has none)."""
    types = cfg.get("layer_types")
    if types is None:
        return [
            "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
            for i in range(n)
        ]
    named: list[str] = [_LEGACY_TYPES.get(t) or t for t in types] if isinstance(types, list) else []
    if len(named) != n or any(t not in _TYPES for t in named):
        raise _refuse("layer_types", types, f" (one of {', '.join(_TYPES)} for each of the {n} layers)")
    return named


def _number(key: str, value: Any, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise _refuse(key, value, " (must be a positive number)")
    return float(value)


def _rope(cfg: dict[str, Any], types: list[str], head_dim: int) -> dict[str, Any]:
    """The full layers' rope as the model's (rope_theta, rope_scaling) and the sliding layers' plain base, read as
    Lfm3RotaryEmbedding reads them: only the types present; a base defaults to a top-level rope_theta, then 1e6, a
    partial_rotary_factor to a top-level one (standardize_rope_params)."""
    params = cfg.get("rope_parameters")
    params = _DEFAULT_ROPE if params is None else params
    if not isinstance(params, dict):
        raise _refuse("rope_parameters", params, " (LFM3 nests it by layer type)")
    flat = sorted(k for k in params if k not in _TYPES[1:])
    if flat:  # (transformers' rotary embedding would look its types up in a flat dict and fail)
        raise _refuse(f"rope_parameters.{flat[0]}", params[flat[0]], " (LFM3 nests rope_parameters by layer type)")
    out: dict[str, Any] = {"rope_theta": _THETA, "rope_scaling": None, "local_rope_theta": None, "local_rope_dim": None}
    for kind in ("full_attention", "sliding_attention"):
        if kind not in types:
            continue  # (transformers reads no rope for an absent type)
        entry = params.get(kind)
        if not isinstance(entry, dict):
            raise _refuse(f"rope_parameters.{kind}", entry, f" (the {kind} layers need a rope)")
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        theta = _number(f"rope_parameters.{kind}.rope_theta", entry.get("rope_theta", cfg.get("rope_theta", _THETA)))
        allowed = ("default", "proportional") if kind == "full_attention" else ("default",)
        if rope_type not in allowed:
            raise _refuse(f"rope_parameters.{kind}.rope_type", rope_type, f"; supported: {', '.join(allowed)}")
        if kind == "sliding_attention":
            out.update(local_rope_theta=theta, local_rope_dim=head_dim)
            continue
        out["rope_theta"] = theta
        if rope_type == "proportional":
            key = f"rope_parameters.{kind}"
            fraction = entry.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
            fraction = 1.0 if fraction is None else _number(f"{key}.partial_rotary_factor", fraction)
            if fraction > 1:
                raise _refuse(f"{key}.partial_rotary_factor", fraction, " (at most 1: the share of pairs that turn)")
            factor = _number(f"{key}.factor", entry.get("factor", 1.0))
            if fraction != 1.0 or factor != 1.0:  # (otherwise the plain rope)
                scaling = {"rope_type": "proportional", "partial_rotary_factor": fraction}
                out["rope_scaling"] = scaling if factor == 1.0 else {**scaling, "factor": factor}
    return out


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an lfm3 config; refuses, naming the key, what it does not compute."""
    if model_type != "lfm3":
        raise UnsupportedModelError(f"{model_type!r} is not an LFM3 model")
    n = fields["num_layers"]
    types = layer_types(cfg, n)
    if not any(t != "conv" for t in types):
        raise _refuse("layer_types", cfg.get("layer_types", types), " (no attention layer at all)")
    conv = ShortConvConfig(
        tuple(t == "conv" for t in types), int(cfg.get("conv_L_cache", 7)), bool(cfg.get("conv_bias"))
    )
    if conv.kernel < 2:
        raise _refuse("conv_L_cache", conv.kernel, " (must be at least 2)")
    windows = None
    if "sliding_attention" in types:
        window = cfg.get("sliding_window", 256)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise _refuse("sliding_window", window, " with sliding_attention layers")
        windows = [window if t == "sliding_attention" else None for t in types]
    eps = cfg.get("rms_norm_eps", cfg.get("norm_eps", 1e-5))  # (attribute_map: rms_norm_eps sets norm_eps)
    return {
        "short_conv": conv if any(conv.conv_layers) else None,  # every layer attends: a plain decoder
        "intermediate_size": int(cfg["intermediate_size"]),
        "rms_norm_eps": _number("norm_eps", eps),
        "qk_norm": True,
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "attn_output_gate": "sigmoid_head" if cfg.get("use_attention_gate", True) else None,
        "sandwich_norms": bool(cfg.get("use_sandwich_norm", True)),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "layer_windows": windows,
        **_rope(cfg, types, fields["head_dim"]),
    }


def attention_config(cfg: ModelConfig) -> ModelConfig:
    """The config an LFM attention layer is built from (its layer_idx: its place in the KV pool, attention layers
    only): the windows by pool layer, and no proportional rope -- the full layers' is the torch runner's table
    (transformers' initialiser) and the MLX model file's full_inv_freq over the whole head, not a rope of
    layers.rotary_dim's leading part of each head."""
    windows, scaling = cfg.layer_windows, cfg.rope_scaling
    if windows is not None and cfg.short_conv is not None:
        windows = [w for w, conv in zip(windows, cfg.short_conv.conv_layers, strict=True) if not conv]
    if (scaling or {}).get("rope_type") == "proportional":
        scaling = None
    if windows == cfg.layer_windows and scaling is cfg.rope_scaling:
        return cfg  # (LFM2: every field as it is)
    return dataclasses.replace(cfg, layer_windows=windows, rope_scaling=scaling)


def full_inv_freq(cfg: ModelConfig) -> np.ndarray | None:
    """The full layers' proportional rope as inverse frequencies over the whole head (Gemma 4's); None: a plain
    rope."""
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type") != "proportional":
        return None
    fraction, factor = float(scaling["partial_rotary_factor"]), float(scaling.get("factor", 1.0))
    return proportional_inv_freq(cfg.head_dim, fraction, cfg.rope_theta, factor)
