"""Gemma 4 (text): what its config.json means, as transformers' Gemma4TextConfig reads it, turned into
ModelConfig fields (model_type gemma4_text; the vision-language gemma4 folders serve this model).

What differs from Gemma 3 (the maths both backends implement, transformers 5's Gemma4TextModel):
- Norms scale by the weight itself (not 1 + weight), in float32; values get a scale-free RMSNorm; the
  query scale is 1 (the q/k norms set it); embeddings times sqrt(hidden_size) as Gemma's.
- Sliding layers (head_dim, num_key_value_heads, plain rope of their own base) and full layers
  (global_head_dim, and num_global_key_value_heads where attention_k_eq_v: then V is K's projection,
  before K's norm) differ in shape: the KV pool holds each layer in its own shape (ModelConfig.kv_shapes).
  The full layers' rope is "proportional": pairs past partial_rotary_factor turn by 0 (cos 1, sin 0)
  over the whole head, not a rotation of a leading part.
- The last num_kv_shared_layers layers compute no K/V: each reads the K/V of the last earlier layer of
  its type (kv_sources); there the MLP may be twice as wide (use_double_wide_mlp).
- Per-layer embeddings (PLE): a second table [vocab, layers x ple] (times sqrt(ple)) plus a projection
  of the embeddings (times hidden ** -0.5, RMS-normed per layer), summed times 2 ** -0.5; each layer
  adds per_layer_projection(gelu(per_layer_input_gate(h)) * its slice), normed, to its output.
- Each layer's output is multiplied by its layer_scalar (a checkpoint scalar).
- The MoE variant (enable_moe_block) runs the dense MLP and a routed mixture side by side: the router
  reads the residual stream (scale-free RMSNorm, times scale and hidden ** -0.5), softmax over all
  experts, top-k renormalised, times per_expert_scale; the experts read pre_feedforward_layernorm_2 of
  the residual; both halves get their own post-norms, summed, then the post-feedforward norm.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse

_LAYER_TYPES = ("sliding_attention", "full_attention")
_ROPES = ("default", "proportional")


@dataclass(frozen=True)
class Gemma4Layers:
    layer_types: tuple[str, ...]
    global_head_dim: int  # full-attention layers' head_dim (sliding ones: ModelConfig.head_dim)
    global_kv_heads: int
    k_eq_v: bool  # full layers take V from K's projection (no v_proj)
    kv_sources: tuple[int, ...]  # per layer: the KV-pool layer its attention reads (its own, or an earlier one)
    mlp_widths: tuple[int, ...]
    ple_dim: int  # hidden_size_per_layer_input; 0: no per-layer embeddings
    ple_vocab: int
    global_rope_theta: float
    global_rope_fraction: float  # proportional rope: the share of each head's pairs that turn
    global_rope_factor: float

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    def writes_kv(self, layer: int) -> bool:
        """The layer computes K/V and writes its own pool layer (False: it reads an earlier layer's)."""
        return self.kv_sources[layer] == layer

    def global_inv_freq(self) -> np.ndarray:
        """The full layers' inverse frequencies over the whole head (transformers' proportional rope)."""
        return proportional_inv_freq(
            self.global_head_dim, self.global_rope_fraction, self.global_rope_theta, self.global_rope_factor
        )


def proportional_inv_freq(dim: int, fraction: float, theta: float, factor: float) -> np.ndarray:
    """transformers' proportional rope (_compute_proportional_rope_parameters) as inverse frequencies over a whole
    head of `dim`: the first int(fraction * dim // 2) pairs turn by theta ** (-2i / dim) / factor, the rest not."""
    turning = int(fraction * dim // 2)
    inv = 1.0 / (theta ** (np.arange(0, 2 * turning, 2, dtype=np.float32) / dim))
    inv = np.concatenate([inv.astype(np.float32), np.zeros(dim // 2 - turning, np.float32)])
    return (inv / np.float32(factor)).astype(np.float32)


def kv_sources_of(types: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV-pool layer (Gemma4TextConfig.kv_sharing_modes): its own, or for the last `shared`
    layers the last earlier layer of their type; the pool holds the writing layers only."""
    n = len(types)
    first = n - shared
    if shared and first <= 0:
        raise _refuse("num_kv_shared_layers", shared, f" (every one of the {n} layers would share K/V)")
    sources = []
    for i in range(n):
        if i < first:
            sources.append(i)
            continue
        producers = [j for j in range(first) if types[j] == types[i]]
        if not producers:
            raise _refuse("num_kv_shared_layers", shared, f" (layer {i}'s type {types[i]} has no earlier layer)")
        sources.append(producers[-1])
    return tuple(sources)


def _shapes_by_type(
    cfg: dict[str, Any], types: list[str], kv_heads: int, head_dim: int, k_eq_v: bool
) -> dict[str, tuple[int, int]]:
    """(kv heads, head dim) of each layer type: per_layer_config's overrides by layer index (configs saved
    by transformers 5), else global_head_dim / num_global_key_value_heads for the full layers (released
    configs; Gemma4TextConfig turns them into those overrides, the KV heads only where attention_k_eq_v)."""
    per_layer = cfg.get("per_layer_config")
    if per_layer is None:
        full = {"head_dim": cfg.get("global_head_dim", 512)}
        if k_eq_v and cfg.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        per_layer = {i: full for i, t in enumerate(types) if t == "full_attention"}
    overrides = {int(i): dict(v or {}) for i, v in per_layer.items()}
    for i, over in overrides.items():
        unknown = sorted(set(over) - {"head_dim", "num_key_value_heads"})
        if unknown or not 0 <= i < len(types):
            raise _refuse(f"per_layer_config.{i}", over, " (per-layer head_dim / num_key_value_heads only)")
    shapes: dict[str, tuple[int, int]] = {}
    for i, t in enumerate(types):
        over = overrides.get(i, {})
        shape = (int(over.get("num_key_value_heads", kv_heads)), int(over.get("head_dim", head_dim)))
        if shapes.setdefault(t, shape) != shape:
            raise _refuse("per_layer_config", per_layer, f" (the {t} layers differ in shape)")
    return shapes


def _rope(cfg: dict[str, Any], types: list[str]) -> dict[str, Any]:
    params = dict(cfg.get("rope_parameters") or {})
    if params and not set(params) <= set(_LAYER_TYPES):
        flat = sorted(set(params) - set(_LAYER_TYPES))[0]
        raise _refuse(f"rope_parameters.{flat}", params[flat], " (Gemma 4 nests rope_parameters by layer type)")
    local = dict(params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0})
    full = dict(params.get("full_attention") or {})
    if not params:  # Gemma4TextConfig's defaults
        full = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    if local.get("rope_type", "default") != "default":
        raise _refuse("rope_parameters.sliding_attention.rope_type", local["rope_type"], " (plain rope only)")
    kind = full.get("rope_type", "default")
    if kind not in _ROPES:
        raise _refuse("rope_parameters.full_attention.rope_type", kind, f"; supported: {', '.join(_ROPES)}")
    fraction = float(full.get("partial_rotary_factor", 1.0)) if kind == "proportional" else 1.0
    return {
        "rope_theta": float(local.get("rope_theta", 10_000.0)),
        "global_rope_theta": float(full.get("rope_theta", 10_000.0)),
        "global_rope_fraction": fraction,
        "global_rope_factor": float(full.get("factor", 1.0)) if kind == "proportional" else 1.0,
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a gemma4_text config (spec.ModelConfig.from_hf)."""
    if model_type != "gemma4_text":
        raise UnsupportedModelError(f"{model_type!r} is not a Gemma 4 model")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise _refuse("hidden_activation", act, "; supported: gelu_pytorch_tanh")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on the attention projections)")
    if cfg.get("use_bidirectional_attention") == "all":
        raise _refuse("use_bidirectional_attention", "all", " (non-causal attention)")
    n = fields["num_layers"]
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)
    ]  # Gemma4TextConfig: 5 sliding to 1 full
    types = list(types)
    if len(types) != n or any(t not in _LAYER_TYPES for t in types):
        raise _refuse("layer_types", types, f" (expected {n} of {_LAYER_TYPES})")
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    window = cfg.get("sliding_window", 512)
    if "sliding_attention" in types and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    head_dim = int(cfg.get("head_dim") or 256)
    kv_heads = fields["num_kv_heads"]
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    shapes_by_type = _shapes_by_type(cfg, types, kv_heads, head_dim, k_eq_v)
    global_kv, global_dim = shapes_by_type["full_attention"]
    kv_heads, head_dim = shapes_by_type.get("sliding_attention", (kv_heads, head_dim))
    if fields["num_heads"] % global_kv or fields["num_heads"] % kv_heads:
        raise _refuse("num_global_key_value_heads", global_kv, " (query heads must be a multiple of the KV heads)")
    sources = kv_sources_of(types, int(cfg.get("num_kv_shared_layers", 0) or 0))
    inner = int(cfg["intermediate_size"])
    double = bool(cfg.get("use_double_wide_mlp", False))
    widths = tuple(inner * (2 if double and s != i else 1) for i, s in enumerate(sources))
    moe = None
    if cfg.get("enable_moe_block"):  # the routed mixture beside every layer's dense MLP
        from lantern.app.models.family_moe import MoEConfig

        experts, top_k = int(cfg.get("num_experts") or 0), int(cfg.get("top_k_experts") or 0)
        if not 1 <= top_k <= experts:
            raise _refuse("top_k_experts", top_k, f" (must be between 1 and num_experts={experts})")
        moe = MoEConfig(experts, top_k, int(cfg["moe_intermediate_size"]), norm_topk_prob=True)
    rope = _rope(cfg, types)
    layers = Gemma4Layers(
        layer_types=tuple(types),
        global_head_dim=global_dim,
        global_kv_heads=global_kv,
        k_eq_v=k_eq_v,
        kv_sources=sources,
        mlp_widths=widths,
        ple_dim=int(cfg.get("hidden_size_per_layer_input", 256) or 0),
        ple_vocab=int(cfg.get("vocab_size_per_layer_input", cfg["vocab_size"])),
        global_rope_theta=rope["global_rope_theta"],
        global_rope_fraction=rope["global_rope_fraction"],
        global_rope_factor=rope["global_rope_factor"],
    )
    shapes = tuple(shapes_by_type[t] for i, t in enumerate(types) if sources[i] == i)
    cap = cfg.get("final_logit_softcapping")
    return {
        "gemma4": layers,
        "moe": moe,
        "hidden_act": "gelu_tanh",
        "head_dim": head_dim,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": None,
        "layer_windows": [int(window) if t == "sliding_attention" else None for t in types]
        if "sliding_attention" in types
        else None,
        "attn_scale": 1.0,
        "final_softcap": float(cap) if cap else None,
        "embed_scale": True,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 131_072)),
        "kv_shapes": shapes,
    }


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The gemma4_text config inside a vision-language gemma4 config.json (Gemma4Config: the wrapper ties,
    by default yes)."""
    from lantern.app.models.spec import wrapped_text_config

    return wrapped_text_config(cfg, "gemma4_text", cfg.get("tie_word_embeddings", True), _TEXT_DEFAULTS)


# Gemma4TextConfig's defaults for the keys ModelConfig.from_hf requires.
_TEXT_DEFAULTS = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_SHARED_KV = re.compile(r"\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")
_RENAMES = (
    (re.compile(r"\.experts\.switch_glu\."), ".mlp.switch_mlp."),  # mlx_lm's stacked experts
    (re.compile(r"\.experts\.(gate_up_proj|down_proj)$"), r".mlp.experts.\1"),  # transformers' fused experts
    (re.compile(r"\.router\.proj\."), ".mlp.gate."),
    (re.compile(r"\.router\.scale$"), ".mlp.router_scale"),
    (re.compile(r"\.router\.per_expert_scale$"), ".mlp.per_expert_scale"),
)


def checkpoint_name(name: str, layers: Gemma4Layers) -> str | None:
    """A Gemma 4 tensor name in the model files' terms: the routed experts and router under the layer's
    `mlp` (beside the dense MLP's projections); None for the K/V projections and norms a KV-sharing
    layer's checkpoint may still carry (transformers ignores them too)."""
    m = _LAYER.match(name)
    if m and not layers.writes_kv(int(m.group(1))) and _SHARED_KV.search(name):
        return None
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name


def gguf_tensors(source: Iterator[tuple[str, Any]], cfg: Any) -> Iterator[tuple[str, Any]]:
    """A Gemma 4 GGUF's stream in the model files' terms: the K/V tensors of KV-sharing layers (llama.cpp's
    converter keeps what the checkpoint holds) dropped, and a --fuse-qkv file's attn_qkv split into q, k and
    v by that layer's shape (a sharing layer keeps its q rows only)."""
    layers = cfg.gemma4
    for name, value in source:
        if name.endswith(".self_attn.qkv_proj.weight"):
            layer = int(name.split(".")[2])
            sliding = layers.is_sliding(layer)
            dim = cfg.head_dim if sliding else layers.global_head_dim
            kv = (cfg.num_kv_heads if sliding else layers.global_kv_heads) * dim
            q = cfg.num_heads * dim
            if value.shape[0] != q + 2 * kv:
                raise ValueError(f"{name} has {value.shape[0]} rows; layer {layer}'s q, k and v take {q + 2 * kv}")
            base = name.removesuffix("qkv_proj.weight")
            for part, start, end in (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv)):
                sliced = f"{base}{part}.weight"
                if checkpoint_name(sliced, layers) is not None:
                    yield sliced, value.rows(start, end) if hasattr(value, "rows") else value[start:end]
            continue
        if checkpoint_name(name, layers) is not None:
            yield name, value
