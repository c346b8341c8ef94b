"""Llama 4 (Scout / Maverick: model_type llama4_text, or the language model of a `llama4` folder), as transformers'
Llama4TextConfig reads its config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_llama4): Llama's decoder layer whose rope turns consecutive pairs (a complex
product: rope_interleaved), and on every no_rope_layer_interval-th layer no rope at all (no_rope_layers: 0).
The rope layers L2-normalise each head's q and k after the rope (use_qk_norm: an RMS norm without weight) and
attend within chunks of attention_chunk_size tokens; the NoPE layers scale their queries by
1 + attn_scale * log(1 + floor((position + 1) / floor_scale)) (attn_temperature_tuning; Ministral 3's
AttnTemperature with an offset of one). The MLPs of moe_layers (every interleave_moe_layer_step-th) are a
mixture: a router picks num_experts_per_tok experts by their logits and scales each expert's *input* by the
sigmoid of its logit, beside an always-on shared expert; experts and shared expert are intermediate_size wide,
the other layers' dense MLPs intermediate_size_mlp. Checkpoints name the MLP `feed_forward` and store the
experts fused as [E, hidden, 2 * inner] / [E, inner, hidden] (transposed while loading).

Chunked attention is implemented within one chunk: the served context is at most attention_chunk_size
(8192 for the released models), where it is full causal attention; more is refused naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_ministral import AttnTemperature
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.spec import UnsupportedModelError, wrapped_text_config

# Llama4TextConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,  # default_theta
}


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The llama4_text config inside a `llama4` (Llama4ForConditionalGeneration) config.json."""
    return wrapped_text_config(cfg, "llama4_text", bool(cfg.get("tie_word_embeddings", False)))


def _int_list(key: str, value: Any) -> list[int]:
    if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in value):
        raise _refuse(key, value, " (a list of integers)")
    return value


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a llama4_text config; refuses, naming the key, what it does not compute."""
    if model_type != "llama4_text":
        raise UnsupportedModelError(f"family_llama4 does not configure model_type {model_type!r}")
    check_silu(cfg, "Llama 4")
    if cfg.get("attention_bias"):  # (o_proj's too)
        raise _refuse("attention_bias", cfg["attention_bias"], " for Llama 4 (biases on the projections)")
    layers = fields["num_layers"]
    interval = int(cfg.get("no_rope_layer_interval", 4))
    # (transformers' default when the list is absent or empty)
    no_rope = _int_list(
        "no_rope_layers", cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    )
    if len(no_rope) != layers or set(no_rope) - {0, 1}:
        raise _refuse("no_rope_layers", no_rope, f" (1 or 0 for each of the {layers} layers)")
    experts, top_k = int(cfg.get("num_local_experts", 16)), int(cfg.get("num_experts_per_tok", 1))
    stated = cfg.get("moe_layers")  # (transformers' default only when absent: [] is a dense model, Llama Guard 4's)
    if stated is None:
        step = int(cfg.get("interleave_moe_layer_step", 1))
        if step < 1:
            raise _refuse("interleave_moe_layer_step", step, " (must be at least 1 without moe_layers)")
        stated = list(range(step - 1, layers, step))
    sparse = set(_int_list("moe_layers", stated)) if experts > 0 else set()
    if any(not 0 <= i < layers for i in sparse):
        raise _refuse("moe_layers", stated, f" (layer indices below {layers})")
    if top_k != 1 and sparse:  # (each expert's input is scaled by its weight: one expert per token here)
        raise _refuse("num_experts_per_tok", top_k, " (Llama 4's router picks one expert)")
    rope_layers = tuple(bool(v) for v in no_rope)
    chunk = cfg.get("attention_chunk_size", 8192)
    types = cfg.get("layer_types") or [
        "chunked_attention" if rotates and chunk is not None else "full_attention" for rotates in rope_layers
    ]
    if len(types) != layers or set(types) - {"chunked_attention", "full_attention"}:
        raise _refuse("layer_types", types, f" (chunked_attention or full_attention for each of the {layers} layers)")
    chunked = "chunked_attention" in types
    if chunked and not chunk:
        raise _refuse("attention_chunk_size", chunk, " with chunked_attention layers")
    temperature = None
    if cfg.get("attn_temperature_tuning", True):
        temperature = AttnTemperature(
            beta=float(cfg.get("attn_scale", 0.1)), length=int(cfg.get("floor_scale", 8192)), offset=1
        )
    dense = tuple(i for i in range(layers) if i not in sparse)
    return {
        "intermediate_size": int(cfg.get("intermediate_size_mlp", 16384)),  # the dense layers' MLP
        "moe": MoEConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=int(cfg.get("intermediate_size", 8192)),  # the experts' and the shared expert's
            norm_topk_prob=False,
            dense_layers=dense,
        )
        if sparse
        else None,
        "rope_layers": None if all(rope_layers) else rope_layers,
        "qk_norm": bool(cfg.get("use_qk_norm", True)),  # (weightless, after the rope, on rope layers: the model file)
        "qk_norm_after_rope": True,
        "attn_temperature": temperature if not all(rope_layers) else None,  # (NoPE layers only: the model file)
        "attention_chunk": int(chunk) if chunked else None,
    }


def layer_attention_config(cfg: Any, layer_idx: int) -> Any:
    """A layer's view of the config for its attention: q/k norms on rope layers, the query temperature on NoPE
    layers (the config states both for the model)."""
    rotates = cfg.rope_layers is None or cfg.rope_layers[layer_idx]
    temperature = None if rotates else cfg.attn_temperature
    return dataclasses.replace(cfg, qk_norm=cfg.qk_norm and rotates, attn_temperature=temperature)


_NAMES = {
    ".feed_forward.router.": ".mlp.gate.",
    ".feed_forward.shared_expert.": ".mlp.shared_expert.",
    ".feed_forward.": ".mlp.",
}


def checkpoint_name(name: str) -> str:
    """A Llama 4 checkpoint's tensor name in the model files' terms (its MLP `mlp`, the router its `gate`)."""
    for old, new in _NAMES.items():
        if old in name:
            return name.replace(old, new)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The fused experts as Llama4TextExperts holds them (gate_up_proj [E, hidden, 2 * inner], down_proj
    [E, inner, hidden]: bmm's [E, in, out]) in transformers' common layout [E, out, in], which the stream splits."""
    for name, value in source:
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")) and getattr(value, "ndim", 0) == 3:
            if not hasattr(value, "swapaxes"):
                raise UnsupportedModelError(f"{name}: quantized fused Llama 4 experts are not implemented")
            value = value.swapaxes(1, 2)
        yield name, value
