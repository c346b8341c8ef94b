"""MPT (mosaicml/mpt-7b / -instruct / -chat / -storywriter, mpt-30b: model_type mpt), as transformers' MptConfig
reads its config.json (defaults included), turned into ModelConfig fields; it runs in the MPT model files (Jais 2's
sequential layer without biases, LayerNorms with a weight only).

The maths (transformers' modeling_mpt): q, k and v stacked in one Wqkv (clamped to [-clip_qkv, clip_qkv] where
attn_config.clip_qkv is set), scores scaled by attn_config.softmax_scale (default head_dim ** -0.5) plus ALiBi
(build_mpt_alibi_tensor: slope 2^(-i * alibi_bias_max / n') for i = 1 .. n' over the next power of two n' of
heads, interleaved (odd ones first) where the head count is none); an MLP down(gelu(up(x))) 4 x d_model wide (the
exact GELU); no biases anywhere; a final LayerNorm norm_f and the head tied to the embedding. transformers computes
none of MosaicML's other switches, so configs that set them are refused by name: attn_config.alibi false (its
learned positions instead), qk_ln, prefix_lm, attn_uses_sequence_id, a multi-query attn_type, expansion_ratio
other than 4, no_bias false (biases transformers would not load), logit_scale. attn_config.alibi_bias_max is
honoured as MosaicML's code and llama.cpp honour it (transformers always takes 8; every released MPT states 8).
"""

from __future__ import annotations

import math
import re
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse

# MptConfig's defaults and attribute_map
_DEFAULTS = {"vocab_size": 50368, "d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048}
_KEYS = {"hidden_size": "d_model", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}


def mpt_alibi_slopes(heads: int, bias_max: float = 8.0) -> tuple[float, ...]:
    """ALiBi's slope per head as MPT computes them (equal to BLOOM's for a power-of-two head count and bias max 8)."""
    padded = 2 ** math.ceil(math.log2(heads))
    slopes = [1.0 / 2 ** (i * bias_max / padded) for i in range(1, padded + 1)]
    if padded != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return tuple(slopes)


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads."""
    out = {**_DEFAULTS, **cfg}
    for key, short in _KEYS.items():
        if short in cfg or key not in cfg:  # (MptConfig's attribute_map: either name)
            out[key] = out[short]
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    return {
        **out,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": 4 * hidden,  # (MptMLP: 4 x hidden whatever expansion_ratio says: other ratios refused)
        "max_position_embeddings": out["max_seq_len"],
    }


_REFUSED_ATTN = {"qk_ln": False, "prefix_lm": False, "attn_uses_sequence_id": False, "alibi": True}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern (and transformers) does not compute."""
    if model_type != "mpt":
        raise UnsupportedModelError(f"family_mpt does not configure model_type {model_type!r}")
    attn = dict(cfg.get("attn_config") or {})
    theirs = " (MosaicML's own code; transformers' MPT does not compute it)"
    for key, want in _REFUSED_ATTN.items():
        if bool(attn.get(key, want)) != want:
            raise refuse(f"attn_config.{key}", attn[key], theirs)
    if attn.get("attn_type", "multihead_attention") != "multihead_attention":
        raise refuse("attn_config.attn_type", attn["attn_type"], " (multihead_attention only)")
    for key, want in (("expansion_ratio", 4), ("no_bias", True), ("logit_scale", None)):
        if cfg.get(key, want) != want:
            raise refuse(key, cfg[key], theirs)
    clip, scale = attn.get("clip_qkv"), attn.get("softmax_scale")
    return {
        "hidden_act": "gelu",
        "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
        "attention_bias": False,
        "mlp_bias": False,
        "clip_qkv": float(clip) if clip else None,
        "attn_scale": float(scale) if scale else None,
        "alibi_slopes": mpt_alibi_slopes(fields["num_heads"], float(attn.get("alibi_bias_max", 8))),
        "rope_layers": (False,) * fields["num_layers"],
        "rope_scaling": None,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),  # (MptConfig's default: tied)
    }


_LAYER = {
    "norm_1": "input_layernorm",
    "attn.Wqkv": "self_attn.qkv_proj",
    "attn.out_proj": "self_attn.o_proj",
    "norm_2": "post_attention_layernorm",
    "ffn.up_proj": "mlp.up_proj",
    "ffn.down_proj": "mlp.down_proj",
}
_GLOBAL = {"transformer.wte": "model.embed_tokens", "transformer.norm_f": "model.norm", "lm_head": "lm_head"}
_RE = re.compile(r"^transformer\.blocks\.(\d+)\.(.+)\.([a-z_]+)$")


def checkpoint_name(name: str) -> str | None:
    """An MPT checkpoint's tensor under the model files' name; an unknown name is kept for them to refuse."""
    m = _RE.match(name)
    if m is not None:
        mapped = _LAYER.get(m.group(2))
        return name if mapped is None else f"model.layers.{m.group(1)}.{mapped}.{m.group(3)}"
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL[stem]}.{kind}" if stem in _GLOBAL else name
