"""Llama-attention models over DeepSeek-V3's mixture (backends/*/models/llama_moe.py), as transformers' config
classes read their config.json (defaults included), turned into ModelConfig fields.

dots.llm1 (rednote-hilab/dots.llm1.base / .inst: model_type dots1, Dots1Config):
transformers' modeling_dots1: Qwen3's attention (per-head q/k RMSNorms before the rope) in Llama's
decoder layer; the MLPs from first_k_dense_replace on are DeepSeek-V3's mixture (a float32 sigmoid router whose
choice adds e_score_correction_bias within n_group groups, weights renormalised with norm_topk_prob and scaled by
routed_scaling_factor, n_shared_experts always-on experts: family_deepseek.routed_experts), the first layers a
dense MLP of intermediate_size. Layers from max_window_layers on attend within sliding_window when it is set
(the released 62-layer model has none such).

Solar Open (upstage/Solar-Open-100B: model_type solar_open, SolarOpenConfig, a Glm4MoeConfig): Llama's attention
(q/k/v biases with attention_bias, none on o_proj; no q/k norms) over GLM-4.5's mixture, which is DeepSeek-V3's,
in every layer (no dense MLP: its config has no intermediate_size).

Flint (RecursiveSI/flint: model_type flint, FlintConfig): Qwen3-MoE's attention (q/k norms) with a learned sink
logit per head (the checkpoint's `softmax_offset`), sliding layers where layer_types says and the rope on those
only (the full layers are NoPE); a float32 sigmoid router without a bias, its top-k renormalised (no epsilon),
beside an ungated shared expert (`shared_expert`, shared_expert_intermediate_size wide); mlp_only_layers dense.

HY-V3 (Tencent Hunyuan 3: model_type hy_v3, HYV3Config): Apertus's attention (per-head q/k RMSNorms before the rope)
in Llama's layer over DeepSeek-V3's mixture without groups -- a float32 sigmoid router whose choice adds
e_score_correction_bias (stored on the mixture, `mlp.e_score_correction_bias`), the top-k renormalised and
scaled by router_scaling_factor, num_shared_experts' MLP beside it -- where mlp_layer_types says "sparse" (by
default every layer but the first). Its multi-token-prediction layers, stored after the stack, are skipped; its
router (`mlp.router.gate`), router bias (`mlp.expert_bias`) and shared experts (`mlp.shared_mlp`) are renamed.

DeepSeek-MoE (deepseek-ai/deepseek-moe-16b-base / -chat: model_type deepseek, remote code, DeepseekConfig): Llama's
layer over DeepSeek's first mixture -- a softmax over every routed expert in the model dtype, the top-k weights as
they are (renormalised only with norm_topk_prob, + 1e-20 as its MoEGate does), n_shared_experts' MLP
(n_shared_experts x moe_intermediate_size wide) always added -- from first_k_dense_replace on (every
moe_layer_freq-th layer: 1 in the releases), a dense MLP of intermediate_size before.

Klear (Kwai-Klear/Klear-46B-A2.5B: model_type "Klear", remote code; mlx_lm's Klear reads it): Qwen3's attention
(per-head q/k RMSNorms, heads hidden_size / heads wide, a plain rope) over a float32 sigmoid router whose choice adds
expert_bias, the top-k renormalised with norm_topk_prob, beside n_shared_experts' MLP; the two outputs mixed by a
softmax over mlp.coefficient(x) (two logits, with a bias). Layers in mlp_only_layers (or off decoder_sparse_step) are
a dense MLP.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_attention_types, check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig, routed_experts
from lantern.app.models.spec import UnsupportedModelError

# Dots1Config's / SolarOpenConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
SOLAR_OPEN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 196608,
    "hidden_size": 4096,
    "intermediate_size": 0,  # (every layer a mixture)
    "num_hidden_layers": 48,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,  # default_theta
}
DEFAULTS: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 4608,
    "intermediate_size": 10944,
    "num_hidden_layers": 62,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
}


# HYV3Config's defaults for the keys ModelConfig.from_hf and _hy_v3 read
HY_V3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 120832,
    "hidden_size": 4096,
    "intermediate_size": 13312,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "rope_theta": 11158840.0,  # default_theta
    "num_experts": 192,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "moe_intermediate_size": 1536,
    "router_scaling_factor": 2.826,
}


# DeepseekConfig's defaults (deepseek-moe's configuration_deepseek.py) for the keys ModelConfig.from_hf reads
DEEPSEEK_DEFAULTS: dict[str, Any] = {
    "vocab_size": 102400,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 30,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a dots1, solar_open, flint, hy_v3, deepseek or Klear config; refuses, naming the
    key, what it does not compute."""
    if model_type == "deepseek":
        return _deepseek(cfg, fields)
    if model_type == "Klear":
        return _klear(cfg, fields)
    if model_type == "hy_v3":
        return _hy_v3(cfg, fields)
    if model_type == "solar_open":
        return _solar_open(cfg, fields)
    if model_type == "flint":
        return _flint(cfg, fields)
    if model_type != "dots1":
        raise UnsupportedModelError(f"family_llama_moe does not configure model_type {model_type!r}")
    check_silu(cfg, "dots.llm1")
    if cfg.get("attention_bias"):  # (Qwen3Attention's would bias o_proj too)
        raise _refuse("attention_bias", cfg["attention_bias"], " for dots1 (biases on the projections)")
    layers = fields["num_layers"]
    window, first = cfg.get("sliding_window", 4096), cfg.get("max_window_layers", 62)
    types = cfg.get("layer_types") or [
        "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)
    ]
    check_attention_types(types, layers)
    if "sliding_attention" in types and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    windows = [int(window) if t == "sliding_attention" else None for t in types]
    return {
        "qk_norm": True,
        "moe": routed_experts(model_type, cfg, layers),
        "layer_windows": windows if any(windows) else None,
    }


def _solar_open(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "Solar Open")
    rope = cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):  # (LlamaAttention turns every dimension)
        raise _refuse("partial_rotary_factor", partial, " for solar_open (Llama's attention turns the whole head)")
    moe = routed_experts("solar_open", {**cfg, "first_k_dense_replace": 0}, fields["num_layers"])
    return {"moe": moe, "intermediate_size": moe.intermediate_size if moe is not None else fields["intermediate_size"]}


# FlintConfig's defaults for the keys ModelConfig.from_hf and _flint read
FLINT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 150144,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 49,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "sliding_window": 513,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 1024,
    "num_experts_per_tok": 6,
    "num_experts": 256,
    "norm_topk_prob": True,
    "mlp_only_layers": [0, 1],
    "decoder_sparse_step": 1,
}


def _flint(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "Flint")
    if cfg.get("attention_bias"):  # (Qwen3MoeAttention's would bias o_proj too)
        raise _refuse("attention_bias", cfg["attention_bias"], " for flint (biases on the projections)")
    if cfg.get("decoder_sparse_step") not in (None, 1):
        raise _refuse("decoder_sparse_step", cfg["decoder_sparse_step"], " for flint (every layer past the dense)")
    layers, window = fields["num_layers"], cfg["sliding_window"]
    types = cfg.get("layer_types") or [
        "full_attention" if i < 2 or i % 4 == 1 or i == layers - 1 else "sliding_attention" for i in range(layers)
    ]
    check_attention_types(types, layers)
    if not isinstance(window, int) or window < 1:
        raise _refuse("sliding_window", window, " (a positive number of tokens)")
    experts, top_k = int(cfg["num_experts"]), int(cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    dense = cfg.get("mlp_only_layers")
    dense = [0, 1] if dense is None else dense  # (FlintConfig fills a null one so)
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        router_weights_fp32=True,
        dense_layers=tuple(int(i) for i in dense),
        scoring="sigmoid",
        shared_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        norm_eps=0.0,
    )
    return {
        "qk_norm": True,
        "moe": moe,
        "attn_sinks": True,
        "layer_windows": [window if t == "sliding_attention" else None for t in types],
        "rope_layers": tuple(t == "sliding_attention" for t in types),  # (the full layers are NoPE)
    }


def _hy_v3(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "HY-V3")
    for key in ("attention_bias", "mlp_bias"):  # (ApertusAttention's would bias o_proj too)
        if cfg.get(key):
            raise _refuse(key, cfg[key], " for hy_v3 (biases on the projections)")
    layers = fields["num_layers"]
    kinds = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(kinds) != layers or set(kinds) - {"dense", "sparse"}:
        raise _refuse("mlp_layer_types", kinds, f" (dense or sparse for each of the {layers} layers)")
    experts, top_k = int(cfg["num_experts"]), int(cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts or experts < 2:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts, at least 2)")
    inner = int(cfg["moe_intermediate_size"])
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=True,
        router_weights_fp32=True,
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        scoring="sigmoid",
        topk_method="noaux_tc",  # (V3's choice with its bias, in one group)
        correction_bias=True,
        routed_scaling_factor=float(cfg["router_scaling_factor"]),
        shared_size=int(cfg.get("num_shared_experts") or 0) * inner,
    )
    return {"qk_norm": True, "moe": moe if "sparse" in kinds else None}


def _deepseek(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "DeepSeek-MoE")
    if cfg.get("attention_bias") and cfg.get("attention_out_bias", True):  # (its DeepseekAttention biases o_proj too)
        raise _refuse("attention_bias", cfg["attention_bias"], " for deepseek (biases on the projections)")
    if cfg.get("scoring_func", "softmax") != "softmax":  # (its MoEGate computes no other)
        raise _refuse("scoring_func", cfg["scoring_func"], " for deepseek (its router is a softmax)")
    if cfg.get("moe_layer_freq", 1) != 1:
        raise _refuse("moe_layer_freq", cfg["moe_layer_freq"], " (every layer past first_k_dense_replace sparse)")
    experts, layers = int(cfg.get("n_routed_experts") or 0), fields["num_layers"]
    first = int(cfg.get("first_k_dense_replace") or 0)
    if experts == 0 or first >= layers:
        return {"moe": None}  # (DeepseekDecoderLayer: a dense MLP in every layer)
    top_k = cfg.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    inner = cfg.get("moe_intermediate_size", 1407)
    if not isinstance(inner, int) or inner < 1:
        raise _refuse("moe_intermediate_size", inner, " (a positive width)")
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) and top_k > 1,
        router_weights_fp32=True,
        first_dense=first,
        shared_size=int(cfg.get("n_shared_experts") or 0) * inner,
        router_fp32=False,  # (its MoEGate scores in the model dtype)
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),  # (Ling 1.x's; DeepSeek-MoE has none)
    )
    return {"moe": moe, "attention_bias": bool(cfg.get("attention_bias"))}  # (Ling 1.x's q/k/v biases, none on o_proj)


def _klear(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    check_silu(cfg, "Klear")
    if cfg.get("attention_bias"):  # (its attention would bias o_proj too)
        raise _refuse("attention_bias", cfg["attention_bias"], " for Klear (biases on the projections)")
    if cfg.get("rope_scaling"):  # (its attention's rope is plain: mlx_lm's and its own code)
        raise _refuse("rope_scaling", cfg["rope_scaling"], " for Klear (a plain rope)")
    heads = fields["num_heads"]
    if cfg.get("head_dim") not in (None, fields["hidden_size"] // heads):
        raise _refuse("head_dim", cfg["head_dim"], " for Klear (its heads are hidden_size / heads wide)")
    layers, step = fields["num_layers"], int(cfg.get("decoder_sparse_step", 1))
    if step < 1:
        raise _refuse("decoder_sparse_step", step, " (a positive layer count)")
    only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    experts, top_k = int(cfg.get("num_experts") or 0), int(cfg.get("num_experts_per_tok", 1))
    sparse = [experts > 0 and i not in only and (i + 1) % step == 0 for i in range(layers)]
    if not any(sparse):
        return {"qk_norm": True, "moe": None}
    if not 1 <= top_k <= experts or experts < 2:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts, at least 2)")
    inner, shared = int(cfg["moe_intermediate_size"]), int(cfg.get("n_shared_experts") or 0)
    if shared < 1:  # (its mixture always mixes in the shared experts)
        raise _refuse("n_shared_experts", cfg.get("n_shared_experts"), " for Klear (at least one)")
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        router_weights_fp32=False,  # (the weights in the activations' dtype before the experts are scaled)
        dense_layers=tuple(i for i, s in enumerate(sparse) if not s),
        scoring="sigmoid",
        topk_method="noaux_tc",  # (the choice by score + expert_bias, one group)
        correction_bias=True,
        shared_size=shared * inner,
        norm_eps=0.0,
        shared_mix=True,
    )
    return {"qk_norm": True, "moe": moe, "tie_word_embeddings": False}


_RENAMES = (
    (".self_attn.softmax_offset", ".self_attn.sinks"),  # Flint's
    (".mlp.shared_expert.", ".mlp.shared_experts."),
    (".mlp.router.gate.", ".mlp.gate."),  # HY-V3's (as released; transformers' own names below)
    (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias"),
    (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
    (".mlp.shared_mlp.", ".mlp.shared_experts."),
)


def checkpoint_name(name: str) -> str:
    """Flint's and HY-V3's tensor names as the model files' (DeepSeek's names for the router, its bias and the
    shared experts)."""
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return name
