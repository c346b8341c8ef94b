"""MiniMax-M2 (MiniMax-M2, M2.1: model_type minimax_m2): what its config.json means, as transformers 5's
MiniMaxM2Config reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_minimax_m2): Llama's decoder layer (pre-norms), attention without biases
whose q and k are RMS-normed over the whole projection, all heads together (OLMo 2's norms,
models/olmo.OlmoAttention), then rotated on the first rotary_dim dims of each head (the halves: rotate_half);
every layer's MLP is a mixture of experts under DeepSeek-V3's sigmoid router without groups or shared
experts: the choice adds e_score_correction_bias, the weights are the unbiased scores renormalised
(family_deepseek.DeepSeekMoEConfig, models/deepseek.DeepSeekMoE). The checkpoints keep Mixtral's names
(block_sparse_moe, w1 / w3 / w2) with the bias beside the router; MiniMax's releases are FP8 with
128 x 128 block scales (quant/hf_formats). Multi-token-prediction modules stored after the decoder's
layers (use_mtp, num_mtp_modules) are skipped while loading.
"""

from __future__ import annotations

import json
from typing import Any

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# MiniMaxM2Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "intermediate_size": 1536,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 196608,
    "rope_theta": 5000000.0,  # default_theta
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a minimax_m2 config; refuses, naming the key, what it does not compute."""
    if model_type != "minimax_m2":
        raise UnsupportedModelError(f"family_minimax does not configure model_type {model_type!r}")
    check_silu(cfg, "MiniMax-M2")
    attn_types = cfg.get("attn_type_list") or []
    if any(t != 1 for t in attn_types):  # 0: MiniMax-01's lightning (linear) attention layers
        raise _refuse("attn_type_list", attn_types, " (only softmax attention layers, 1, are)")
    for key, wanted in (("use_qk_norm", True), ("qk_norm_type", "per_layer"), ("use_routing_bias", True)):
        if cfg.get(key, wanted) != wanted:  # transformers' model computes only these
            raise _refuse(key, cfg[key], f" (MiniMax-M2 computes {json.dumps(wanted)})")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise _refuse("scoring_func", cfg["scoring_func"], " (the router is a sigmoid)")
    for key in ("shared_intermediate_size", "n_shared_experts"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (MiniMax-M2 has no shared experts)")
    if cfg.get("attention_bias") or cfg.get("sliding_window"):
        key = "attention_bias" if cfg.get("attention_bias") else "sliding_window"
        raise _refuse(key, cfg[key], " (MiniMax-M2 has none)")
    experts, top_k = (
        int(cfg.get("num_local_experts", cfg.get("num_experts", 256))),
        int(cfg.get("num_experts_per_tok", 8)),
    )
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    head_dim = fields["head_dim"]
    rope = dict(cfg.get("rope_parameters") or {})
    rotary = cfg.get("rotary_dim")
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    # the released configs state rotary_dim; transformers reads it as the partial factor unless rope_parameters has
    # one. Handed to rope_scaling at the top level too, which a rope_scaling dict (YaRN added for context) lacks.
    if rotary is not None and partial is None:
        partial = int(rotary) / head_dim
    max_pos = fields["max_position_embeddings"]
    # prediction modules stored after the decoder's layers are skipped whether or not use_mtp is on
    mtp = int(cfg.get("num_mtp_modules") or 0)
    return {
        "attention_bias": False,
        "qk_norm": False,  # the whole-projection norms are the model file's own
        "hidden_act": "silu",
        "rope_scaling": rope_scaling({**cfg, "head_dim": head_dim, "partial_rotary_factor": partial}, rope, max_pos),
        "mtp_layers": mtp,
        "moe": DeepSeekMoEConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=fields["intermediate_size"],
            norm_topk_prob=True,
            router_weights_fp32=True,  # transformers' expert outputs are scaled by the float32 weights
            scoring="sigmoid",
            topk_method="noaux_tc",  # one group: the top-k of the biased scores
            correction_bias=True,
        ),
    }


def checkpoint_name(name: str) -> str:
    """The router's bias where the model files keep it (family_moe.moe_name renames the rest)."""
    for old in (".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias"):
        if name.endswith(old):
            return name.removesuffix(old) + ".mlp.gate.e_score_correction_bias"
    return name
