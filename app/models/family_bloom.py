"""BLOOM / BLOOMZ (bigscience/bloom*, bloomz*: model_type bloom), as transformers' BloomConfig reads its config.json
(defaults included), turned into ModelConfig fields; it runs in the Jais 2 model files (Llama's sequential layer
under LayerNorms with biases, biased attention, an ungated MLP with biases).

The maths (transformers' modeling_bloom): the token embedding goes through a LayerNorm (word_embeddings_layernorm:
ModelConfig.embed_norm) before the first layer; no rope: ALiBi adds slope_h x key position to each head's scaled
scores (slopes alibi_slopes computes, as _get_alibi_slopes: a geometric series from 2^(-8/n) for the nearest power of
two n of heads, the rest from its doubled series' odd powers); q/k/v in one query_key_value with each head's q, k,
v together (reordered while loading); an MLP dense_4h_to_h(gelu(dense_h_to_4h(x))) 4 x hidden wide with BLOOM's
tanh GELU; a final LayerNorm ln_f and the head tied to the embedding. apply_residual_connection_post_layernorm
(the residual taken after the norm) is refused; pretraining_tp / slow_but_exact only reorder float sums.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.grouped_qkv import reorder_rows, stacked_order

# BloomConfig's defaults and attribute_map (n_layer / n_head; n_embed: its older name of hidden_size)
_DEFAULTS = {"vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8}


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi's slope per head as BLOOM computes them (the paper's geometric series, extended for head counts that
    are not powers of two)."""
    power = 2 ** math.floor(math.log2(heads))
    base = 2 ** (-(2 ** -(math.log2(power) - 3)))
    slopes = [base**i for i in range(1, power + 1)]
    if power != heads:
        extra = 2 ** (-(2 ** -(math.log2(2 * power) - 3)))
        slopes += [extra**i for i in range(1, 2 * min(power, heads - power), 2)]
    return tuple(float(s) for s in slopes)


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads."""
    out = {**_DEFAULTS, **cfg}
    hidden = cfg.get("n_embed", out["hidden_size"])
    heads = out.get("num_attention_heads", out["n_head"]) if "n_head" not in cfg else cfg["n_head"]
    layers = out.get("num_hidden_layers", out["n_layer"]) if "n_layer" not in cfg else cfg["n_layer"]
    return {
        **out,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": 4 * hidden,
        "max_position_embeddings": out.get("seq_length") or 2048,  # (no positions: BLOOM was trained at 2048)
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern does not compute."""
    if model_type != "bloom":
        raise UnsupportedModelError(f"family_bloom does not configure model_type {model_type!r}")
    if cfg.get("apply_residual_connection_post_layernorm"):
        raise refuse("apply_residual_connection_post_layernorm", True, " (the residual taken after the norm)")
    return {
        "hidden_act": "gelu_tanh",
        "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
        "attention_bias": True,
        "mlp_bias": True,
        "alibi_slopes": alibi_slopes(fields["num_heads"]),
        "embed_norm": True,
        "rope_layers": (False,) * fields["num_layers"],
        "rope_scaling": None,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


_LAYER = {
    "input_layernorm": "input_layernorm",
    "self_attention.query_key_value": "self_attn.qkv_proj",
    "self_attention.dense": "self_attn.o_proj",
    "post_attention_layernorm": "post_attention_layernorm",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
}
_GLOBAL = {
    "word_embeddings": "model.embed_tokens",
    "word_embeddings_layernorm": "model.embed_norm",
    "ln_f": "model.norm",
}
_RE = re.compile(r"^(?:transformer\.)?(?:h\.(\d+)\.)?(.+)\.([a-z_]+)$")


def checkpoint_name(name: str) -> str | None:
    """A BLOOM checkpoint's tensor under the model files' name (with or without bigscience's early files' missing
    "transformer." prefix); an unknown name is kept for the model files to refuse by name."""
    if name == "lm_head.weight":
        return name
    m = _RE.match(name)
    if m is None:
        return name
    layer, part, kind = m.groups()
    mapped = (_GLOBAL if layer is None else _LAYER).get(part)
    if mapped is None:
        return name
    return f"{mapped}.{kind}" if layer is None else f"model.layers.{layer}.{mapped}.{kind}"


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """Each head's q, k, v rows of query_key_value (and its bias) reordered to q, then k, then v (a folder's; the
    GGUF converter reorders them so)."""
    cfg = spec.config
    if spec.weight_format == "gguf":
        yield from source
        return
    order = stacked_order(cfg.num_heads, 1, cfg.head_dim)
    for name, value in source:
        yield name, reorder_rows(value, order) if ".self_attn.qkv_proj." in name else value
