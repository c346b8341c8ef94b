"""Aleph Alpha's Kolibri-1 (model_type kolibri1, Kolibri1Config): what its config.json means, as transformers reads it.

transformers' modeling_kolibri1: EXAONE 4's attention (per-head q/k RMSNorms before the rope; sliding layers where
layer_types says, the rope on those only when a window is set, the full layers NoPE) in GLM-4's sandwich layer (a
norm after attention and after the MLP besides the pre-norms), and DeepSeek-V3's mixture in every layer: a float32
router choosing the top-k of its *logits* plus an expert bias (not of their sigmoids), weighting the chosen by their
sigmoid (renormalised only with norm_topk_prob, which is off by default; no routed scaling), beside an always-on
shared expert of shared_expert_intermediate_size. The layer is AFMoE's (backends/*/models/afmoe.py) without its gate.
"""

from __future__ import annotations

import re
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_attention_types, check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig

# Kolibri1Config's defaults for the keys ModelConfig.from_hf and configure read
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128000,
    "hidden_size": 2560,
    "intermediate_size": 0,  # (no dense MLP: every layer a mixture)
    "num_hidden_layers": 50,
    "num_attention_heads": 48,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "sliding_window": 513,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 6,
    "num_experts": 384,
    "norm_topk_prob": False,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a kolibri1 config; refuses, naming the key, what it does not compute."""
    if model_type != "kolibri1":
        raise UnsupportedModelError(f"family_kolibri does not configure model_type {model_type!r}")
    check_silu(cfg, "Kolibri-1")
    layers, window = fields["num_layers"], cfg.get("sliding_window")
    types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)
    ]
    check_attention_types(types, layers)
    sliding = [t == "sliding_attention" for t in types]
    if any(sliding) and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise refuse("sliding_window", window, " (a positive number of tokens for the sliding layers)")
    experts = int(cfg.get("num_local_experts") or cfg["num_experts"])
    top_k = int(cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        router_weights_fp32=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        correction_bias=True,
        choose_on_logits=True,
        shared_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        norm_eps=0.0,
    )
    return {
        "qk_norm": True,
        "attention_bias": False,  # (Kolibri1Attention has no biases, whatever the config says)
        "moe": moe,
        "intermediate_size": moe.intermediate_size,  # (no dense layer)
        "layer_windows": [window if s else None for s in sliding] if window and any(sliding) else None,
        # EXAONE 4's rule: with a window, only the sliding layers turn the rope
        "rope_layers": tuple(sliding) if window else None,
    }


# The released names -> the AFMoE layer's (GLM-4's sandwich: post_attention_layernorm is the pre-MLP norm there)
_NAMES = {
    ".post_attention_layernorm.": ".pre_feedforward_layernorm.",
    ".post_attn_norm.": ".post_attention_layernorm.",
    ".post_ffn_norm.": ".post_feedforward_layernorm.",
    ".moe.router.expert_bias": ".mlp.gate.e_score_correction_bias",
}
_NAME_RE = re.compile("|".join(re.escape(k) for k in _NAMES))


def checkpoint_name(name: str) -> str:
    """A Kolibri-1 tensor name as the AFMoE model files name it (one pass: two of the renames swap names)."""
    return _NAME_RE.sub(lambda m: _NAMES[m.group(0)], name)
