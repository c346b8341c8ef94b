"""The GGUF config builder of StepFun's Step 3.5 Flash (llama.cpp's Step35Model), as StepFun's config.json keys
(family_step3p5 reads them).

What the converter writes and llama.cpp's graph reads: query heads and K/V heads per layer, the sliding layers as a
flag per layer (the prediction layers' too: cut), the full layers' rope over half of rope.dimension_count (llama.cpp
halves it, whatever the checkpoint's partial_rotary_factors were: the converter asserts they are 0.5 and 1) on
rope.freq_base, the sliding ones' over rope.dimension_count_swa on rope.freq_base_swa, a llama3 scaling of the full
layers as a rope_freqs tensor (the full layers' divisors, then 1s), a mixture wherever a layer holds a router (its
bias as exp_probs_b), the weights renormalised where expert_weights_norm says and scaled, per-layer SwiGLU clamps
(swiglu_clamp_exp for the routed experts, swiglu_clamp_shexp for the shared expert and the dense MLPs, 0 for none),
a sigmoid gate per head where the layer holds attn_gate. Norm weights are stored with the 1 added
(family_step3p5.checkpoint_tensors takes it back).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lantern.app.models.gguf_config import _head_dim, _Meta
from lantern.app.models.gguf_rope import ROPE_FREQS, llama3_from_divisors, stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError


def _per_layer(meta: _Meta, key: str, layers: int, default: Any) -> list[Any]:
    value = meta.get(key, default)
    values = list(value) if isinstance(value, (list, tuple)) else [value] * layers
    if len(values) < layers:
        raise UnsupportedModelError(f"{meta.label}step35.{key} has {len(values)} values for {layers} layers")
    return values[:layers]  # (past the stack: the prediction layers')


def _step35(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    layers, head_dim = cfg["num_hidden_layers"], _head_dim(meta, cfg)
    heads = [int(h) for h in _per_layer(meta, "attention.head_count", layers, None)]
    kv = {int(h) for h in _per_layer(meta, "attention.head_count_kv", layers, heads[0])}
    slides = [bool(s) for s in _per_layer(meta, "attention.sliding_window_pattern", layers, None)]
    full_heads = {h for h, s in zip(heads, slides) if not s}
    local_heads = {h for h, s in zip(heads, slides) if s}
    if len(kv) != 1 or len(full_heads) > 1 or len(local_heads) > 1:
        raise UnsupportedModelError(f"{meta.label}step35 heads differing within a layer type are not implemented")
    if int(meta.get("expert_gating_func") or 2) != 2:
        raise UnsupportedModelError(f"{meta.label}step35.expert_gating_func other than sigmoid (2) is not implemented")
    if stated_rope_scaling(meta):
        raise UnsupportedModelError(f"{meta.label}step35.rope.scaling.* is not implemented (llama3 as rope_freqs)")
    dims = int(meta.get("rope.dimension_count") or head_dim)
    full_dims, local_dims = dims // 2, int(meta.get("rope.dimension_count_swa") or dims)
    base = cfg["rope_theta"]
    local_base = float(meta.get("rope.freq_base_swa") or base)
    out: dict[str, Any] = {
        "model_type": "step3p5",
        "head_dim": head_dim,
        "num_attention_heads": next(iter(full_heads or local_heads)),
        "num_attention_groups": kv.pop(),
        "attention_other_setting": {"num_attention_heads": next(iter(local_heads or full_heads))},
        "layer_types": ["sliding_attention" if s else "full_attention" for s in slides],
        "sliding_window": int(meta.need("attention.sliding_window")),
        "rope_theta": [local_base if s else base for s in slides],
        "partial_rotary_factors": [(local_dims if s else full_dims) / head_dim for s in slides],
        "moe_num_experts": int(meta.need("expert_count")),
        "moe_top_k": int(meta.need("expert_used_count")),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length")),
        "share_expert_dim": int(meta.get("expert_shared_feed_forward_length") or 0),
        "moe_router_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "norm_expert_weight": bool(meta.get("expert_weights_norm", False)),  # (absent: llama.cpp does not)
        "use_moe_router_bias": any(name.endswith("exp_probs_b.bias") for name in tensors),
        "moe_layers_enum": ",".join(str(i) for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in tensors),
        "use_head_wise_attn_gate": "blk.0.attn_gate.weight" in tensors,
        "swiglu_limits": [float(v) for v in _per_layer(meta, "swiglu_clamp_exp", layers, 0.0)],
        "swiglu_limits_shared": [float(v) for v in _per_layer(meta, "swiglu_clamp_shexp", layers, 0.0)],
    }
    freqs = tensors.get(ROPE_FREQS)
    if freqs is not None:  # (the full layers' divisors, padded with 1s to the widest rope)
        divisors = np.asarray(freqs.data, dtype=np.float32).reshape(-1).astype(np.float64)
        if np.any(divisors[full_dims // 2 :] != 1.0):
            raise UnsupportedModelError(f"{meta.label}tensor {ROPE_FREQS} divides the sliding layers' frequencies")
        where = f"{meta.label}tensor {ROPE_FREQS} (per-frequency rope divisors)"
        scaling = llama3_from_divisors(divisors[: full_dims // 2], base, full_dims, where)
        if scaling:
            out |= {"rope_scaling": scaling, "yarn_only_types": ["full_attention"]}
    return out


STEP_BUILDERS = {"step35": _step35}
