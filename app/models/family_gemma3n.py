"""Gemma 3n (text; model_type gemma3n_text, and the language model of the multimodal gemma3n folders:
gemma-3n-E2B / E4B): what its config.json means, as transformers' Gemma3nTextConfig reads it, turned into
ModelConfig fields.

Gemma 3n shares Gemma 4's skeleton (family_gemma4.Gemma4Layers: Gemma4RMSNorm's weight-times norms, q/k
norms and a scale-free v norm, query scale 1, K/V shared by the last num_kv_shared_layers layers, per-layer
embeddings, sliding and full layers, soft-capped logits); its full layers differ only by rope base (plain
rope over the whole head) and every layer has one shape. What it adds (transformers 5's modeling_gemma3n):
- AltUp: the residual stream is altup_num_inputs streams. The embedding is stream 0; the others are
  altup_projections of it, each rescaled to stream 0's RMS. Each layer predicts every stream from all of
  them (coefficients from a tanh router over the active stream), runs attention and the MLP on the active
  prediction, then corrects every stream by the innovation (the layer's output minus the active prediction)
  times router-made coefficients + 1. At the end the other streams go through altup_unembed_projections,
  rescaled to stream 0's RMS, and the streams are averaged.
- LAuReL: beside attention, x + norm(linear_right(linear_left(x))) of the normed input, summed with the
  attention's residual and divided by sqrt(2).
- Activation sparsity: in the layers whose activation_sparsity_pattern is > 0, the MLP's gate keeps what
  lies above mean + std * Phi^-1(sparsity) of its row (relu of the difference) before the GELU.
- The per-layer embedding's term (gated by the corrected active stream, times correct_output_scale) is added
  to streams 1.. (transformers' corrected_predictions[1:], whatever altup_active_idx is).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_gemma4 import Gemma4Layers, kv_sources_of

_LAYER_TYPES = ("sliding_attention", "full_attention")
_GLOBAL_THETA, _LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3nTextConfig.default_theta


@dataclass(frozen=True)
class Gemma3nBlocks:
    altup_inputs: int  # streams of the residual
    altup_active: int  # the stream the layers compute on
    altup_correct_scale: bool  # the corrected active stream times correct_output_scale before the PLE gate
    laurel_rank: int
    # per layer: the gate's cutoff in standard deviations above its mean (float32), None for a dense layer
    sparsity_cutoffs: tuple[float | None, ...]


def _sparsity_cutoffs(cfg: dict[str, Any], n: int) -> tuple[float | None, ...]:
    stated = cfg.get("activation_sparsity_scale")  # a GGUF's: the cutoffs as llama.cpp's converter computed them
    if stated is not None:
        if len(stated) != n:
            raise _refuse("activation_sparsity_scale", list(stated), f" (expected {n} values)")
        return tuple(float(np.float32(c)) if c > -1e30 else None for c in stated)  # -inf: a dense layer
    pattern = cfg.get("activation_sparsity_pattern")
    if pattern is None:  # Gemma3nTextConfig: the first 10 layers at 0.95 when there are more than 10
        pattern = [0.95 if n > 10 and i < 10 else 0.0 for i in range(n)]
    elif not isinstance(pattern, (list, tuple)):
        pattern = [pattern] * n
    if len(pattern) != n or any(not 0.0 <= float(p) < 1.0 for p in pattern):
        raise _refuse("activation_sparsity_pattern", pattern, f" (expected {n} values in [0, 1))")
    # transformers: Normal(0, 1).icdf of the float32 target in float32; the double inverse rounded to float32 is
    # that value or an ulp beside it
    return tuple(float(np.float32(NormalDist().inv_cdf(float(np.float32(p))))) if p else None for p in pattern)


def _rope_thetas(cfg: dict[str, Any]) -> tuple[float, float]:
    """(sliding layers' base, full layers' base): rope_parameters nested by layer type (configs saved by
    transformers 5) or rope_local_base_freq / rope_theta (the released configs); plain rope only."""
    params = dict(cfg.get("rope_parameters") or {})
    if params and not set(params) <= set(_LAYER_TYPES):
        flat = dict(params)  # a flat dict: the full layers' (Gemma3nTextConfig folds rope_scaling into them)
        params = {"full_attention": flat}
    scaling = cfg.get("rope_scaling")
    if scaling:
        raise _refuse("rope_scaling", scaling, " (Gemma 3n is served with plain rope)")
    local = dict(params.get("sliding_attention") or {})
    full = dict(params.get("full_attention") or {})
    for kind, p in (("sliding_attention", local), ("full_attention", full)):
        if p.get("rope_type", "default") != "default":
            raise _refuse(f"rope_parameters.{kind}.rope_type", p["rope_type"], " (plain rope only)")
    local_theta = local.get("rope_theta") or cfg.get("rope_local_base_freq") or _LOCAL_THETA
    full_theta = full.get("rope_theta") or cfg.get("rope_theta") or _GLOBAL_THETA
    return float(local_theta), float(full_theta)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a gemma3n_text config (spec.ModelConfig.from_hf)."""
    if model_type != "gemma3n_text":
        raise UnsupportedModelError(f"{model_type!r} is not a Gemma 3n model")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise _refuse("hidden_activation", act, "; supported: gelu_pytorch_tanh")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on the attention projections)")
    n = fields["num_layers"]
    types = list(
        cfg.get("layer_types") or ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    )
    if len(types) != n or any(t not in _LAYER_TYPES for t in types):
        raise _refuse("layer_types", types, f" (expected {n} of {_LAYER_TYPES})")
    window = cfg.get("sliding_window", 512)
    if "sliding_attention" in types and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    widths = cfg["intermediate_size"]
    widths = [int(w) for w in widths] if isinstance(widths, (list, tuple)) else [int(widths)] * n
    if len(widths) != n:
        raise _refuse("intermediate_size", widths, f" (one width per layer: {n})")
    ple_dim = int(cfg.get("hidden_size_per_layer_input", 256) or 0)
    if ple_dim <= 0:
        raise _refuse("hidden_size_per_layer_input", ple_dim, " (Gemma 3n's layers always read a per-layer input)")
    streams, active = int(cfg.get("altup_num_inputs", 4)), int(cfg.get("altup_active_idx", 0))
    if streams < 1 or not 0 <= active < streams:
        raise _refuse("altup_active_idx", active, f" (altup_num_inputs={streams})")
    sources = kv_sources_of(types, int(cfg.get("num_kv_shared_layers", 15) or 0))  # (Gemma3nTextConfig's 15)
    local_theta, full_theta = _rope_thetas(cfg)
    head_dim, kv_heads = fields["head_dim"], fields["num_kv_heads"]
    layers = Gemma4Layers(
        layer_types=tuple(types),
        global_head_dim=head_dim,
        global_kv_heads=kv_heads,
        k_eq_v=False,
        kv_sources=sources,
        mlp_widths=tuple(widths),
        ple_dim=ple_dim,
        ple_vocab=int(cfg.get("vocab_size_per_layer_input", 262_144)),
        global_rope_theta=full_theta,
        global_rope_fraction=1.0,
        global_rope_factor=1.0,
    )
    blocks = Gemma3nBlocks(
        altup_inputs=streams,
        altup_active=active,
        altup_correct_scale=bool(cfg.get("altup_correct_scale", True)),
        laurel_rank=int(cfg.get("laurel_rank", 64)),
        sparsity_cutoffs=_sparsity_cutoffs(cfg, n),
    )
    cap = cfg.get("final_logit_softcapping", 30.0)
    return {
        "gemma4": layers,
        "gemma3n": blocks,
        "intermediate_size": max(widths),
        "hidden_act": "gelu_tanh",
        "rope_theta": local_theta,
        "rope_scaling": None,
        "layer_windows": [int(window) if t == "sliding_attention" else None for t in types]
        if "sliding_attention" in types
        else None,
        "attn_scale": 1.0,
        "final_softcap": float(cap) if cap else None,
        "embed_scale": True,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 32_768)),
        "kv_shapes": tuple((kv_heads, head_dim) for i in range(n) if sources[i] == i),
    }


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The gemma3n_text config inside a multimodal gemma3n config.json (its head is tied to the embedding)."""
    from lantern.app.models.spec import wrapped_text_config

    return wrapped_text_config(cfg, "gemma3n_text", cfg.get("tie_word_embeddings", True), DEFAULTS)


# Gemma3nTextConfig's defaults (the E4B shape) for the keys ModelConfig.from_hf requires.
DEFAULTS = {
    "vocab_size": 262_400,
    "hidden_size": 2048,
    "intermediate_size": 16_384,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
}


_STACKED = ("model.altup_projections.weight", "model.altup_unembed_projections.weight")


def gguf_tensors(source: Iterator[tuple[str, Any]], cfg: Any) -> Iterator[tuple[str, Any]]:
    """A Gemma 3n GGUF's stream (after family_gemma4.gguf_tensors) with llama.cpp's stacked AltUp projections
    (altup_proj / altup_unembd_proj [n - 1, d, d], read as [(n - 1) d, d]) split into one matrix per stream."""
    d = cfg.hidden_size
    for name, value in source:
        if name not in _STACKED:
            yield name, value
            continue
        streams = cfg.gemma3n.altup_inputs - 1
        if value.shape[0] != streams * d:
            raise ValueError(f"{name} has {value.shape[0]} rows; {streams} streams of {d} take {streams * d}")
        stem = name.removesuffix(".weight")
        for i in range(streams):
            rows = value.rows(i * d, (i + 1) * d) if hasattr(value, "rows") else value[i * d : (i + 1) * d]
            yield f"{stem}.{i}.weight", rows
