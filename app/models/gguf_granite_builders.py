"""GGUF config builders of Granite 3 (dense and MoE), GraniteMoeShared and Granite Swash as llama.cpp's GraniteModel,
GraniteMoeModel, GraniteSWAModel and GraniteMoeSWAModel write them; Granite's scalars, which Granite 4.0-H's builder
(gguf_mamba_builders.py) shares."""

from __future__ import annotations

from typing import Any

from lantern.app.models.gguf_config import _head_dim, _Meta
from lantern.app.models.gguf_rope import stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError


def granite_scalars(meta: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite's four scalars, each 1 where the file has none (or 0, as llama.cpp's graph reads it), but the
    query scale, which is then head_dim ** -0.5 as in llama.cpp's graph (GraniteConfig's default of 1.0
    would be another model)."""
    head_dim = _head_dim(meta, cfg)
    return {
        "head_dim": head_dim,
        "attention_multiplier": float(meta.get("attention.scale") or head_dim**-0.5),
        "embedding_multiplier": float(meta.get("embedding_scale") or 1.0),
        "residual_multiplier": float(meta.get("residual_scale") or 1.0),
        "logits_scaling": float(meta.get("logit_scale") or 1.0),
    }


def _granite(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite 3 dense and MoE (llama.cpp's GraniteModel / GraniteMoeModel, LlamaModels: q/k permuted as
    Llama's): its four scalars (granite_scalars), GraniteMoE's experts each feed_forward_length wide."""
    rope = stated_rope_scaling(meta)
    out = {
        "model_type": meta.arch,
        **granite_scalars(meta, cfg),
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_granite
        **({"rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]}} if rope else {}),
    }
    if not meta.get("rope.scaling.finetuned", True):  # llama.cpp's graph: no rope at all
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.rope.scaling.finetuned=false (no rope): not implemented")
    if meta.arch in ("granitemoe", "granite_swa") and meta.get("expert_count"):
        out["num_local_experts"] = int(meta.need("expert_count"))
        out["num_experts_per_tok"] = int(meta.need("expert_used_count"))
        # GraniteMoeShared (and a Swash MoE): a dense SwiGLU beside the experts, its rows as ffn_*_shexp
        out["shared_intermediate_size"] = int(meta.get("expert_shared_feed_forward_length") or 0)
        if meta.arch == "granitemoe" and out["shared_intermediate_size"]:
            out["model_type"] = "granitemoeshared"
    if meta.arch == "granite_swa":
        out.update(_granite_swa(meta, cfg, bool(meta.get("expert_count"))))
    return out


def _granite_swa(meta: _Meta, cfg: dict[str, Any], experts: bool) -> dict[str, Any]:
    """Granite Swash (llama.cpp's GraniteSWAModel / GraniteMoeSWAModel, both granite_swa): sliding layers from
    attention.sliding_window_pattern, NoPE layers from attention.rope_pattern (the converter's no_rope_layers; it
    drops layer_rope_theta, so one base for every rotating layer, as llama.cpp's graph turns them)."""
    layers = cfg["num_hidden_layers"]
    pattern = meta.need("attention.sliding_window_pattern")
    rope = meta.get("attention.rope_pattern")
    for key, value in (("attention.sliding_window_pattern", pattern), ("attention.rope_pattern", rope)):
        if value is not None and (not isinstance(value, (list, tuple)) or len(value) != layers):
            raise UnsupportedModelError(f"{meta.label}granite_swa.{key}={value!r}: one flag per layer is implemented")
    theta = cfg["rope_theta"]
    return {
        "model_type": "granitemoe_swa" if experts else "granite_swa",
        "sliding_window": int(meta.need("attention.sliding_window")),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in pattern],
        "layer_rope_theta": [theta if r else 0 for r in rope] if rope is not None else None,
    }


GRANITE_BUILDERS = {"granite": _granite, "granitemoe": _granite, "granite_swa": _granite}
