"""Hunyuan dense (Tencent's Hunyuan-0.5B / 1.8B / 4B / 7B and Hunyuan-MT-7B: model_type hunyuan_v1_dense), as
transformers 5's HunYuanDenseV1Config reads its config.json, turned into ModelConfig fields.

The maths (transformers' modeling_hunyuan_v1_dense): Llama's decoder layer whose attention RMS-normalizes each
head's query and key *after* the rope (query_layernorm / key_layernorm; ModelConfig.qk_norm_after_rope), under
the released configs' rope_scaling {"type": "dynamic", "alpha": ...}: transformers reads a fixed alpha as NTK
scaling of the base alone, theta * alpha ** (head_dim / (head_dim - 2)), the same at every length, so it is a
plain rope of that base. Without alpha, "dynamic" is the usual dynamic NTK (rope_config).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# HunYuanDenseV1Config's defaults for keys ModelConfig.from_hf defaults otherwise (spec.ARCHITECTURES "defaults")
DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if model_type != "hunyuan_v1_dense":
        raise UnsupportedModelError(f"family_hunyuan does not configure model_type {model_type!r}")
    check_silu(cfg, "Hunyuan")
    # (mlp_bias: transformers' MLP has none whatever the key says; refused rather than computed without it)
    for key, why in (("attention_bias", " (biases on q/k/v and o_proj)"), ("mlp_bias", " (MLP biases)")):
        if cfg.get(key):
            raise _refuse(key, cfg[key], why)
    for key in ("use_cla", "use_mla"):  # cross-layer / latent attention: transformers' model computes neither
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (transformers' Hunyuan computes plain attention)")
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    head_dim = fields["head_dim"]
    out: dict[str, Any] = {"qk_norm": True, "qk_norm_after_rope": True}
    if kind == "dynamic" and rope.get("alpha"):
        # in float32, as transformers' rope uses it (a Python float against a float32 tensor) and GGUF stores it
        out["rope_theta"] = float(np.float32(theta * float(rope["alpha"]) ** (head_dim / (head_dim - 2))))
        out["rope_scaling"] = None
    else:
        out["rope_scaling"] = rope_scaling({**cfg, "rope_scaling": None}, rope, fields["max_position_embeddings"])
    return out


def checkpoint_name(name: str) -> str:
    """The per-head query / key norms under the model files' names."""
    return name.replace(".self_attn.query_layernorm.", ".self_attn.q_norm.").replace(
        ".self_attn.key_layernorm.", ".self_attn.k_norm."
    )
