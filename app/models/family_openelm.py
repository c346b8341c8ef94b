"""Apple's OpenELM (apple/OpenELM-270M ... 3B and -Instruct, mlx-community's conversions; model_type "openelm": remote
code, no transformers class), its config.json turned into ModelConfig fields and its checkpoint's tensors under the
model files' names. mlx_lm's openelm model is the reference the tests hold it to.

The maths: Llama's pre-norm layer scaled layer-wise -- each layer has its own query and K/V head counts
(num_query_heads / num_kv_heads, heads of head_dim) and its own MLP width, make_divisible(ffn_multipliers[i] *
model_dim, ffn_dim_divisor) (a SiLU-gated MLP with gate and up fused in proj_1); per-head RMSNorms on q and k before
the rope (normalize_qk_projections), q / k / v fused in qkv_proj, the embedding shared with the head unless
share_input_output_layers is false. The KV pool holds each layer in its own shape (ModelConfig.kv_shapes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError


@dataclass(frozen=True)
class OpenELMLayers:
    q_heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    mlp_widths: tuple[int, ...]


def make_divisible(value: float, divisor: int) -> int:
    """The nearest multiple of divisor (at least divisor), one more if rounding lost more than 10% (OpenELM's and
    mlx_lm's rule for the MLP widths)."""
    out = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * value else out


def _per_layer(cfg: dict[str, Any], key: str, layers: int) -> list[Any]:
    value = cfg.get(key)
    if not isinstance(value, list) or len(value) != layers:
        raise refuse(key, value, f" (one value per each of the {layers} num_transformer_layers)")
    return value


def _layers(cfg: dict[str, Any]) -> OpenELMLayers:
    layers, dim = int(cfg["num_transformer_layers"]), int(cfg["model_dim"])
    q, kv = _per_layer(cfg, "num_query_heads", layers), _per_layer(cfg, "num_kv_heads", layers)
    for i, (a, b) in enumerate(zip(q, kv, strict=True)):
        if not (isinstance(a, int) and isinstance(b, int) and 0 < b <= a and a % b == 0):
            raise refuse(f"num_query_heads[{i}] / num_kv_heads[{i}]", [a, b], " (query heads a multiple of K/V heads)")
    if "ffn_widths" in cfg:  # (a GGUF states the widths: gguf_llama_builders._openelm)
        widths = [int(w) for w in _per_layer(cfg, "ffn_widths", layers)]
    else:
        divisor = int(cfg.get("ffn_dim_divisor", 256))
        widths = [make_divisible(float(m) * dim, divisor) for m in _per_layer(cfg, "ffn_multipliers", layers)]
    return OpenELMLayers(tuple(q), tuple(kv), tuple(widths))


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Llama keys the generic reader needs, from OpenELM's: the most query / K/V heads and the widest MLP."""
    blocks = _layers(cfg)
    return {
        **cfg,
        "hidden_size": int(cfg["model_dim"]),
        "num_hidden_layers": int(cfg["num_transformer_layers"]),
        "num_attention_heads": max(blocks.q_heads),
        # (divides every layer's K/V heads, so every layer's query heads: OpenELM-270M's 12 / 16 / 20 over 3 / 4 / 5)
        "num_key_value_heads": math.gcd(*blocks.kv_heads),
        "intermediate_size": max(blocks.mlp_widths),
        "max_position_embeddings": int(cfg.get("max_context_length", 2048)),
        "rope_theta": float(cfg.get("rope_freq_constant", 10000)),
        "tie_word_embeddings": bool(cfg.get("share_input_output_layers", True)),
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an openelm config.json; refuses, naming the key, what it does not compute."""
    if model_type != "openelm":
        raise UnsupportedModelError(f"family_openelm does not configure model_type {model_type!r}")
    for key, want in (("activation_fn_name", "swish"), ("normalization_layer_name", "rms_norm")):
        if cfg.get(key, want) != want:
            raise refuse(key, cfg[key], f" ({want})")
    if cfg.get("ffn_with_glu", True) is not True:
        raise refuse("ffn_with_glu", cfg["ffn_with_glu"], " (OpenELM's gated MLP)")
    if "head_dim" not in cfg:
        raise refuse("head_dim", None, " (OpenELM states its heads' width)")
    blocks = _layers(cfg)
    head_dim = int(cfg["head_dim"])
    return {
        "openelm": blocks,
        "head_dim": head_dim,
        "layer_heads": blocks.q_heads,
        "kv_shapes": tuple((kv, head_dim) for kv in blocks.kv_heads),
        "qk_norm": bool(cfg.get("normalize_qk_projections", True)),
        "layer_windows": None,
    }


_NAMES = {
    "transformer.token_embeddings.": "model.embed_tokens.",
    "transformer.norm.": "model.norm.",
    ".attn.out_proj.": ".self_attn.o_proj.",
    ".attn.q_norm.": ".self_attn.q_norm.",
    ".attn.k_norm.": ".self_attn.k_norm.",
    ".ffn.proj_2.": ".mlp.down_proj.",
    ".attn_norm.": ".input_layernorm.",
    ".ffn_norm.": ".post_attention_layernorm.",
}


def checkpoint_name(name: str) -> str:
    """An OpenELM tensor under the model files' (Llama's) name; the fused qkv_proj and proj_1 are split by
    checkpoint_tensors."""
    if name.startswith("transformer.layers."):
        name = "model.layers." + name.removeprefix("transformer.layers.")
    for old, new in _NAMES.items():
        name = name.replace(old, new)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """Each layer's fused [q; k; v] (its own head counts) as q_proj / k_proj / v_proj and its [gate; up] as
    gate_proj / up_proj (row slices: a quantized checkpoint stays quantized)."""
    from lantern.app.models.weight_stream import _row_slice

    blocks, head_dim = spec.config.openelm, spec.config.head_dim
    for name, value in source:
        stem, _, kind = name.rpartition(".")
        if stem.endswith(".attn.qkv_proj"):
            layer = int(stem.split(".")[2])
            q, kv = blocks.q_heads[layer] * head_dim, blocks.kv_heads[layer] * head_dim
            base = stem.removesuffix(".attn.qkv_proj") + ".self_attn"
            for part, (a, b) in (("q_proj", (0, q)), ("k_proj", (q, q + kv)), ("v_proj", (q + kv, q + 2 * kv))):
                yield f"{base}.{part}.{kind}", _row_slice(value, a, b)
        elif stem.endswith(".ffn.proj_1"):
            width = blocks.mlp_widths[int(stem.split(".")[2])]
            base = stem.removesuffix(".ffn.proj_1") + ".mlp"
            yield f"{base}.gate_proj.{kind}", _row_slice(value, 0, width)
            yield f"{base}.up_proj.{kind}", _row_slice(value, width, 2 * width)
        else:
            yield name, value
