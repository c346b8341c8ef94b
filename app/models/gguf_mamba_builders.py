"""GGUF config builders of the Mamba-2 hybrids (family_mamba2's mixer among attention layers): Granite 4.0-H and
Nemotron-H as llama.cpp's GraniteHybridModel and NemotronHModel write them, and Nemotron 3's file refused in
one line. Granite's scalars, which Granite 3's builder (gguf_builders.py) shares, live here too.
"""

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


def _granite_hybrid(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite 4.0-H (llama.cpp's GraniteHybridModel): a layer without KV heads is a Mamba-2 mixer, sized by
    ssm.inner_size, ssm.time_step_rank (its heads), ssm.state_size, ssm.group_count and ssm.conv_kernel;
    rope only where rope.scaling.finetuned says so (the released models have none); the dense shared_mlp
    (ffn_gate, or ffn_gate_shexp beside experts) and the experts sized by their tensors."""
    kv = meta.get("attention.head_count_kv")
    layers = cfg["num_hidden_layers"]
    kinds = ["mamba" if not h else "attention" for h in kv][:layers] if isinstance(kv, (list, tuple)) else None
    kinds = kinds or ["attention"] * layers
    heads, inner, hidden = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size")), cfg["hidden_size"]
    first = f"blk.{kinds.index('mamba')}." if "mamba" in kinds else "blk.0."
    attn = f"blk.{kinds.index('attention')}." if "attention" in kinds else "blk.0."
    experts = int(meta.get("expert_count") or 0)
    shared = tensors.get(f"{attn}ffn_gate{'_shexp' if experts else ''}.weight")
    out: dict[str, Any] = {
        "model_type": "granitemoehybrid",
        **granite_scalars(meta, cfg),
        "layer_types": kinds,
        "position_embedding_type": "rope" if meta.get("rope.scaling.finetuned", True) else "nope",
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        # (family_mamba2 takes int(expand * hidden) as transformers does: a ratio a half step above lands on inner)
        "mamba_expand": inner // hidden if inner % hidden == 0 else (inner + 0.5) / hidden,
        "mamba_d_state": int(meta.need("ssm.state_size")),
        "mamba_n_groups": int(meta.need("ssm.group_count")),
        "mamba_d_conv": int(meta.need("ssm.conv_kernel")),
        "mamba_conv_bias": f"{first}ssm_conv1d.bias" in tensors,
        "mamba_proj_bias": f"{first}ssm_in.bias" in tensors,
        "time_step_limit": [0.0, float("inf")],  # llama.cpp's scan clamps nothing
        "shared_intermediate_size": int(shared.shape[1]) if shared is not None else cfg["intermediate_size"],
        "num_local_experts": experts,
        "attention_bias": f"{attn}attn_q.bias" in tensors,  # refused by family_granite
    }
    if experts:
        gate = tensors.get(f"{attn}ffn_gate_exps.weight")  # [hidden, expert width, experts] in ggml's order
        out["num_experts_per_tok"] = int(meta.need("expert_used_count"))
        out["intermediate_size"] = int(gate.shape[1]) if gate is not None else cfg["intermediate_size"]
    rotated = meta.get("rope.dimension_count")  # (Bamba's files rotate part of each head: not computed here)
    if out["position_embedding_type"] == "rope" and rotated not in (None, out["head_dim"]):
        raise UnsupportedModelError(
            f"{meta.label}granitehybrid.rope.dimension_count={rotated} (a partial rope) is not implemented"
        )
    rope = stated_rope_scaling(meta)
    if rope:
        out["rope_parameters"] = {**rope, "rope_theta": cfg["rope_theta"]}
    return out


def _nemotron_h(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H (llama.cpp's NemotronHModel): a layer with KV heads attends, one with a feed_forward_length
    is a relu^2 MLP, the rest are Mamba-2 mixers (ssm.* as Granite 4.0-H's); no rope, no scalars, no dt clamp."""
    layers = cfg["num_hidden_layers"]
    kv, ff = meta.get("attention.head_count_kv"), meta.get("feed_forward_length")
    if not isinstance(kv, (list, tuple)) or not isinstance(ff, (list, tuple)) or meta.get("expert_count"):
        raise UnsupportedModelError(
            f"{meta.label}nemotron_h without per-layer KV heads and MLP widths (or with experts)"
        )
    kinds = "".join("*" if h else "-" if f else "M" for h, f in zip(kv[:layers], ff[:layers]))
    heads, inner = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size"))
    first = f"blk.{kinds.find('M')}."
    return {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": kinds,
        "head_dim": _head_dim(meta, cfg),
        "mamba_num_heads": heads,
        "mamba_head_dim": inner // heads,
        "ssm_state_size": int(meta.need("ssm.state_size")),
        "n_groups": int(meta.need("ssm.group_count")),
        "conv_kernel": int(meta.need("ssm.conv_kernel")),
        "use_conv_bias": f"{first}ssm_conv1d.bias" in tensors,
        "use_bias": f"{first}ssm_in.bias" in tensors,
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "attention_bias": f"blk.{kinds.find('*')}.attn_q.bias" in tensors,  # refused by family_nemotron_h
    }


def _nemotron_h_moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    raise UnsupportedModelError(
        f"{meta.label}GGUF architecture nemotron_h_moe (Nemotron 3: routed relu^2 experts) is not implemented yet"
    )


MAMBA_BUILDERS = {"granitehybrid": _granite_hybrid, "nemotron_h": _nemotron_h, "nemotron_h_moe": _nemotron_h_moe}
