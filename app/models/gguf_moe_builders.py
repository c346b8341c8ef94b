"""GGUF config builders of the newer mixture-of-experts families, each as llama.cpp's converter writes it (the
helpers are gguf_config's): Arcee Trinity (afmoe), DeepSeek-V3.2 (deepseek32), GLM-5 (glm-dsa), K-EXAONE
(exaone-moe) and Mistral Small 4 (mistral4); MiniCPM3 (minicpm3), whose latent attention is DeepSeek-V2's; and
DBRX (dbrx), Cohere2-MoE (cohere2moe), MiMo-V2-Flash (mimo2) and Kimi Linear (kimi-linear); the older DeepSeek-MoE
(deepseek), Ling 1.x (bailingmoe) and Phi-3.5-MoE (phimoe); Poolside Laguna (laguna) and Tencent's HY-V3 (hy_v3).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lantern.app.models.gguf_config import _deepseek2, _head_dim, _layer_types, _Meta, _phi3, _rotary_fraction
from lantern.app.models.gguf_rope import longrope_tensors, rope_freqs_scaling, stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError

_AFMOE_PERIOD = 4  # llama.cpp's afmoe graph: the rope skips every 4th layer (n_no_rope_layer_step), whatever is stated


def _afmoe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Arcee Trinity (llama.cpp's AfmoeModel: q/k as stored, the router's keys as DeepSeek's, the router bias as
    exp_probs_b). Its graph always scales the embedding by sqrt(n_embd) (muP, the released models' setting) and
    ropes every layer but each 4th; the sliding layers follow attention.sliding_window_pattern (default: the same
    period). A file whose windows and rope layers disagree, or whose router is not the sigmoid, is refused."""
    if int(meta.get("expert_gating_func") or 2) != 2:
        raise UnsupportedModelError(f"{meta.label}afmoe.expert_gating_func other than sigmoid (2) is not implemented")
    base, swa_base = cfg["rope_theta"], meta.get("rope.freq_base_swa")
    if swa_base is not None and float(swa_base) != base:
        raise UnsupportedModelError(
            f"{meta.label}afmoe.rope.freq_base_swa={swa_base} (not the rope base) is not implemented"
        )
    layers = cfg["num_hidden_layers"]
    rotating = ["sliding_attention" if (i + 1) % _AFMOE_PERIOD else "full_attention" for i in range(layers)]
    window = int(meta.get("attention.sliding_window") or 0)
    if window and _layer_types(meta, layers, _AFMOE_PERIOD, True) != rotating:
        raise UnsupportedModelError(
            f"{meta.label}afmoe.attention.sliding_window_pattern is not every {_AFMOE_PERIOD}th layer full "
            "(llama.cpp's rope layers); not implemented"
        )
    out: dict[str, Any] = {
        "model_type": "afmoe",
        "head_dim": _head_dim(meta, cfg),
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "num_shared_experts": int(meta.get("expert_shared_count") or 0),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length")),
        "num_dense_layers": int(meta.get("leading_dense_block_count") or 0),
        "route_scale": float(meta.get("expert_weights_scale") or 1.0),
        "route_norm": bool(meta.get("expert_weights_norm", False)),  # (family_afmoe refuses false: HF renormalises)
        "n_group": int(meta.get("expert_group_count") or 1),
        "topk_group": int(meta.get("expert_group_used_count") or 1),
        "mup_enabled": True,
        "layer_types": rotating,  # the rope's layers (family_afmoe: rope on sliding_attention ones only)
        "sliding_window": window or None,
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_afmoe
    }
    rope = stated_rope_scaling(meta)
    return {**out, "rope_parameters": {**rope, "rope_theta": base}} if rope else out


# llama.cpp's glm-dsa graph without attention.indexer.types: every layer runs its indexer (GLM-5, 5.1), unless the
# file is GLM-5.2's (a context of 1M tokens), whose config.json has two full layers, then one in four
_GLM_52_CONTEXT = 1048576


def _dsa(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3.2 / GLM-5 (llama.cpp's DeepseekV32Model / GlmMoeDsaModel, DeepseekV2Models: deepseek2's MLA keys and
    tensors) with the indexer's head count, key length and top-k; GLM-5's layers that run an indexer from
    attention.indexer.types. No gating key means llama.cpp's default for them, the sigmoid."""
    out = _deepseek2(meta, tensors, cfg)
    if meta.get("expert_gating_func") is None:
        out.update(scoring_func="sigmoid", topk_method="noaux_tc")
    elif out["scoring_func"] != "sigmoid":
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.expert_gating_func other than sigmoid is not implemented")
    glm = meta.arch == "glm-dsa"
    out.update(
        model_type="glm_moe_dsa" if glm else "deepseek_v32",
        index_n_heads=int(meta.need("attention.indexer.head_count")),
        index_head_dim=int(meta.need("attention.indexer.key_length")),
        index_topk=int(meta.need("attention.indexer.top_k")),
    )
    if glm:
        layers = cfg["num_hidden_layers"]
        types = meta.get("attention.indexer.types")
        if types is not None and not isinstance(types, (list, tuple)):
            raise UnsupportedModelError(f"{meta.label}glm-dsa.attention.indexer.types is not one flag per layer")
        if types is None and cfg["max_position_embeddings"] >= _GLM_52_CONTEXT:
            types = [i < 2 or (i - 2) % 4 == 0 for i in range(layers)]
        out["indexer_types"] = ["full" if t else "shared" for t in (types or [True] * layers)]
    return out


def _mistral4(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Mistral Small 4 (llama.cpp's Mistral4Model, a DeepseekV2Model run by its deepseek2 graph): DeepSeek-V3's latent
    attention (pairs turned, nothing permuted) and mixture under a softmax router (family_deepseek's mistral4), YaRN
    as DeepseekV2Model writes it (yarn_log_multiplier: 0.1 * mscale_all_dim); Llama 4's query temperature only
    where the file states attention.temperature_scale (the converter from transformers' config writes none, and
    llama.cpp's graph then applies none), stepping at the YaRN original length as Mistral4Config's does."""
    out = _deepseek2(meta, tensors, cfg)
    if out.pop("scoring_func") != "softmax":
        raise UnsupportedModelError(
            f"{meta.label}mistral4.expert_gating_func other than softmax (1) is not implemented"
        )
    rope = dict(out.pop("rope_scaling", None) or {"type": "default"})
    if rope.get("mscale_all_dim", 1.0) != 1.0:  # (llama.cpp takes mscale = mscale_all_dim for deepseek2 only: for
        # mistral4 its softmax and rope scales match a config only with mscale_all_dim 1, Mistral4Config's)
        log_mul = meta.get("rope.scaling.yarn_log_multiplier")
        raise UnsupportedModelError(
            f"{meta.label}mistral4.rope.scaling.yarn_log_multiplier={log_mul} is not implemented"
        )
    beta, length = meta.get("attention.temperature_scale"), meta.get("attention.temperature_length")
    original = rope.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
    if beta and length is None:  # (llama.cpp's graph asserts on a temperature without its step length)
        raise UnsupportedModelError(f"{meta.label}mistral4.attention.temperature_scale without temperature_length")
    if beta and int(length) != int(original):
        raise UnsupportedModelError(
            f"{meta.label}mistral4.attention.temperature_length={length} (not the YaRN original length {original}) "
            "is not implemented"
        )
    if beta:
        rope["llama_4_scaling_beta"] = float(str(np.float32(beta)))  # (its shortest decimal: the config's)
    return {**out, "model_type": "mistral4", "topk_method": "noaux_tc", "rope_parameters": rope}


def _exaone_moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """K-EXAONE (llama.cpp's ExaoneMoEModel, an Exaone4Model: q/k as stored, pre-norms): EXAONE 4's attention (per-head
    q/k norms; sliding layers from attention.sliding_window_pattern, every 4th full by default, within
    attention.sliding_window; the full layers NoPE, the sliding ones on freq_base, as llama.cpp's graph turns them)
    over DeepSeek-V3's sigmoid router (its groups) and shared experts past
    leading_dense_block_count; block_count counts the prediction layers after the stack (_common takes them off)."""
    if int(meta.need("expert_gating_func")) != 2:  # (llama.cpp's exaone-moe requires it, as it does the window)
        raise UnsupportedModelError(
            f"{meta.label}exaone-moe.expert_gating_func other than sigmoid (2) is not implemented"
        )
    swa_base = meta.get("rope.freq_base_swa")
    if swa_base is not None and float(swa_base) != cfg["rope_theta"]:  # (llama.cpp's graph turns with freq_base)
        raise UnsupportedModelError(f"{meta.label}exaone-moe.rope.freq_base_swa={float(swa_base)} is not implemented")
    inner, count = int(meta.need("expert_feed_forward_length")), int(meta.get("expert_shared_count") or 0)
    shared = meta.get("expert_shared_feed_forward_length")
    if shared is not None and count and int(shared) != inner * count:
        raise UnsupportedModelError(
            f"{meta.label}exaone-moe.expert_shared_feed_forward_length={shared} (not expert_shared_count times "
            "expert_feed_forward_length) is not implemented"
        )
    out: dict[str, Any] = {
        "model_type": "exaone_moe",
        "head_dim": _head_dim(meta, cfg),
        "sliding_window": int(meta.need("attention.sliding_window")),
        "layer_types": _layer_types(meta, cfg["num_hidden_layers"], 4, True),
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "num_shared_experts": count,
        "moe_intermediate_size": inner,
        "first_k_dense_replace": int(meta.get("leading_dense_block_count") or 0),
        "routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "n_group": int(meta.get("expert_group_count") or 1),
        "topk_group": int(meta.get("expert_group_used_count") or 1),
    }
    rope = rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)) or {"rope_type": "default"}
    return {**out, "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]}}


# llama.cpp's minicpm3 graph: muP's three scalars as constants (the converter writes none of them)
_MINICPM3_SCALARS = {"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256}


def _minicpm3(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM3 (llama.cpp's MiniCPM3Model: a TextModel, nothing permuted; NeoX rope on the rope.dimension_count dims
    of the latent attention, kv_b_proj whole): the latent's shape from key_length and the ranks, the value heads
    value_length wide (hidden_size / heads by default, as llama.cpp's), the latents normed with the model's eps,
    muP's scalars as the graph's constants, LongRoPE as the two factor tensors with the trained context as the
    pretraining length (llama.cpp's n_ctx_orig: the short factors unless a context past it is served)."""
    rope_dims = int(meta.need("rope.dimension_count"))
    v_head = meta.get("attention.value_length") or cfg["hidden_size"] // cfg["num_attention_heads"]
    out: dict[str, Any] = {
        "model_type": "minicpm3",
        "kv_lora_rank": int(meta.need("attention.kv_lora_rank")),
        "q_lora_rank": int(meta.need("attention.q_lora_rank")),  # (llama.cpp's minicpm3 requires it)
        "qk_rope_head_dim": rope_dims,
        "qk_nope_head_dim": int(meta.need("attention.key_length")) - rope_dims,
        "v_head_dim": int(v_head),
        "num_key_value_heads": cfg["num_attention_heads"],
        "latent_norm_eps": cfg["rms_norm_eps"],  # (llama.cpp norms the latents with the model's eps)
        **_MINICPM3_SCALARS,
    }
    longrope = longrope_tensors(meta, tensors, cfg)
    if longrope is not None:
        out["rope_scaling"] = longrope
    return out


def _dbrx(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """DBRX (llama.cpp's DbrxModel: a TextModel, nothing permuted; Wqkv as attn_qkv, norm_2 as attn_output_norm, the
    experts stacked with w2 in the down projections' layout; clip_qkv as clamp_kqv): DBRX's own config keys, its
    router's top-k weights renormalised as llama.cpp's graph does (moe_normalize_expert_weights 1)."""
    scale = meta.get("expert_weights_scale")
    if scale is not None and float(scale) not in (0.0, 1.0):
        raise UnsupportedModelError(f"{meta.label}dbrx.expert_weights_scale={scale} is not implemented")
    if stated_rope_scaling(meta):
        raise UnsupportedModelError(f"{meta.label}dbrx rope scaling is not implemented")
    return {
        "model_type": "dbrx",
        "d_model": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"],
        "n_layers": cfg["num_hidden_layers"],
        "max_seq_len": cfg["max_position_embeddings"],
        "attn_config": {
            "kv_n_heads": cfg["num_key_value_heads"],
            "clip_qkv": meta.get("attention.clamp_kqv"),
            "rope_theta": cfg["rope_theta"],
        },
        "ffn_config": {
            "ffn_hidden_size": cfg["intermediate_size"],
            "moe_num_experts": int(meta.need("expert_count")),
            "moe_top_k": int(meta.need("expert_used_count")),
        },
    }


_GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func


def _cohere2moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Cohere2-MoE (llama.cpp's Cohere2MoeModel: a TextModel, nothing permuted; experts stacked, the shared ones
    averaged in; the norms RMSNorms where layer_norm_rms_epsilon is stated, else Cohere's LayerNorms): its graph
    ropes the sliding layers and every leading dense one (prefix_dense_sliding_window_pattern 1 says so in
    Cohere2MoeConfig's terms), gates by a sigmoid unless expert_gating_func says softmax."""
    layers, head_dim = cfg["num_hidden_layers"], _head_dim(meta, cfg)
    scale = meta.get("expert_weights_scale")
    if scale is not None and float(scale) not in (0.0, 1.0):
        raise UnsupportedModelError(f"{meta.label}cohere2moe.expert_weights_scale={scale} is not implemented")
    gating = int(meta.get("expert_gating_func") or 2)
    if gating not in _GATING:
        raise UnsupportedModelError(f"{meta.label}cohere2moe.expert_gating_func={gating} is not implemented")
    swa_base = meta.get("rope.freq_base_swa")
    if swa_base is not None and float(swa_base) != cfg["rope_theta"]:
        raise UnsupportedModelError(f"{meta.label}cohere2moe.rope.freq_base_swa (a base of the sliding layers' own)")
    if _GATING[gating] == "softmax" and not meta.get("expert_weights_norm"):
        # (llama.cpp's graph then weights by the unrenormalised softmax; transformers' by the softmax of the top k)
        raise UnsupportedModelError(f"{meta.label}cohere2moe softmax gating without expert_weights_norm")
    dense = int(meta.get("leading_dense_block_count") or 0)
    rms = meta.get("attention.layer_norm_rms_epsilon")
    return {
        "model_type": "cohere2_moe",
        "head_dim": head_dim,
        "layer_norm_eps": float(meta.get("attention.layer_norm_epsilon") or 1e-5),
        "rms_norm_eps": None if rms is None else float(rms),
        "logit_scale": float(meta.get("logit_scale") or 1.0),
        "sliding_window": int(meta.need("attention.sliding_window")),
        "layer_types": _layer_types(meta, layers, 4, True),
        "rotary_pct": _rotary_fraction(meta, head_dim),  # refused by family_cohere unless 1
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_cohere
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(layers)],
        "prefix_dense_sliding_window_pattern": 1,
        "prefix_dense_intermediate_size": cfg["intermediate_size"],
        "intermediate_size": int(meta.need("expert_feed_forward_length")),
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "num_shared_experts": int(meta.get("expert_shared_count") or 0),
        "shared_expert_combination_strategy": "average",
        "expert_selection_fn": _GATING[gating],
        "norm_topk_prob": bool(meta.get("expert_weights_norm") or False),
    }


def _mimo2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """MiMo-V2-Flash (llama.cpp's MimoV2Model: a TextModel, nothing permuted; q/k and values of their own widths
    (key_length / value_length), each layer's K/V heads and sliding flag per layer, the sliding layers' base as
    rope.freq_base_swa, rope.dimension_count dims of each head turned in both layer types, the sinks as attn_sinks,
    the values' scale as attention.value_scale; its graph's router a sigmoid choosing with exp_probs_b, the top k
    renormalised, no groups), as MiMoV2FlashConfig's keys; sparse layers where a router is stored."""
    layers = cfg["num_hidden_layers"]
    head_dim, v_dim = _head_dim(meta, cfg), int(meta.get("attention.value_length") or _head_dim(meta, cfg))
    kv = meta.get("attention.head_count_kv")
    kv = list(kv)[:layers] if isinstance(kv, (list, tuple)) else [int(kv)] * layers
    sliding = [bool(s) for s in list(meta.need("attention.sliding_window_pattern"))[:layers]]
    full_kv = {k for k, s in zip(kv, sliding) if not s} or {kv[0]}
    swa_kv = {k for k, s in zip(kv, sliding) if s} or full_kv
    if len(full_kv) > 1 or len(swa_kv) > 1:
        raise UnsupportedModelError(f"{meta.label}mimo2 K/V heads {kv}: one count per layer type is implemented")
    rot = int(meta.get("rope.dimension_count") or head_dim)
    partial = rot / head_dim if int(head_dim * (rot / head_dim)) == rot else (rot + 0.25) / head_dim  # (int() as read)
    base_swa = float(meta.get("rope.freq_base_swa") or cfg["rope_theta"])
    scale = meta.get("expert_weights_scale")
    return {
        "model_type": "mimo_v2_flash",
        "head_dim": head_dim,
        "v_head_dim": v_dim,
        "num_key_value_heads": int(full_kv.pop()),
        "swa_num_key_value_heads": int(swa_kv.pop()),
        "hybrid_layer_pattern": [int(s) for s in sliding],
        "sliding_window": int(meta.need("attention.sliding_window")),
        "attention_value_scale": meta.get("attention.value_scale"),
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default",
                "rope_theta": cfg["rope_theta"],
                "partial_rotary_factor": partial,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": base_swa, "partial_rotary_factor": partial},
        },
        "n_routed_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "moe_intermediate_size": int(meta.need("expert_feed_forward_length")),
        "mlp_layer_types": ["sparse" if f"blk.{i}.ffn_gate_inp.weight" in tensors else "dense" for i in range(layers)],
        "routed_scaling_factor": float(scale) if scale else 1.0,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }


def _kimi_linear(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Kimi Linear (llama.cpp's KimiLinearModel: a TextModel, nothing permuted): head_count_kv 0 marks a KDA layer
    (whose heads are the model's, kda.head_dim wide), 1 a latent-attention one (DeepSeek-V2's keys, kv_b_proj split
    as attn_k_b / attn_v_b); the router DeepSeek-V3's over one group, always renormalised, as llama.cpp's graph
    computes it. The latents and
    q/k are normed with the model's eps there, as Lantern then does for the latents."""
    if int(meta.get("expert_gating_func") or 0) != 2:
        raise UnsupportedModelError(
            f"{meta.label}kimi-linear.expert_gating_func other than sigmoid (2) is not implemented"
        )
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv = meta.get("attention.head_count_kv")
    kinds = list(kv) if isinstance(kv, (list, tuple)) else [kv] * layers
    latent = _deepseek2(meta, tensors, cfg)
    dense = int(meta.get("leading_dense_block_count") or 0)
    return {
        **{k: latent[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")},
        "model_type": "kimi_linear",
        "num_key_value_heads": heads,
        "layer_types": ["linear_attention" if not k else "full_attention" for k in kinds],
        "linear_num_heads": heads,
        "linear_head_dim": int(meta.need("kda.head_dim")),
        "linear_conv_kernel_dim": int(meta.need("ssm.conv_kernel")),
        "latent_norm_eps": cfg["rms_norm_eps"],
        "num_local_experts": int(meta.get("expert_count") or 0),
        "num_experts_per_tok": int(meta.get("expert_used_count") or 1),
        "n_shared_experts": int(meta.get("expert_shared_count") or 0),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length", 0) or 0),
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(layers)],
        "routed_scaling_factor": latent["routed_scaling_factor"],
        "n_group": 1,  # (llama.cpp's kimi-linear reads no expert groups: the released models have one)
        "topk_group": 1,
        "norm_topk_prob": True,
    }


def _deepseek_moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-MoE 16B (llama.cpp's DeepseekModel: q/k permuted as Llama's, the experts stacked, the shared experts
    as ffn_*_shexp). Its graph: a softmax over the experts, the top-k weights as they are (whatever the file's
    gating function), times expert_weights_scale (1 as converted); the shared experts' width n_ff_exp x count."""
    scale = meta.get("expert_weights_scale")
    if scale is not None and float(scale) != 1.0:
        raise UnsupportedModelError(f"{meta.label}deepseek.expert_weights_scale={scale} is not implemented")
    head_dim = _head_dim(meta, cfg)
    if head_dim != cfg["hidden_size"] // cfg["num_attention_heads"] or _rotary_fraction(meta, head_dim) != 1.0:
        raise UnsupportedModelError(
            f"{meta.label}deepseek heads other than hidden_size / heads, or a partial rope, are not implemented"
        )
    out: dict[str, Any] = {
        "model_type": "deepseek",
        "n_routed_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "n_shared_experts": int(meta.get("expert_shared_count") or 0),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length")),
        "first_k_dense_replace": int(meta.get("leading_dense_block_count") or 0),
        "norm_topk_prob": False,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    rope = stated_rope_scaling(meta)
    if rope:
        out["rope_scaling"] = rope
    return out


def _ling1(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Ling 1.x (llama.cpp's BailingMoeModel: query_key_value split into q / k / v, q and k permuted as Llama's, the
    head's columns normalised when converted): DeepSeek-MoE's graph with the top-k weights renormalised where
    expert_weights_norm says; read as Ling 1.x's config (family_renamed), its head stored normalised."""
    out = _deepseek_moe(meta, tensors, cfg)
    return {
        **out,
        "model_type": "bailing_moe",
        "num_experts": out.pop("n_routed_experts"),
        "num_shared_experts": out.pop("n_shared_experts"),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "use_qkv_bias": out.pop("attention_bias"),
        "score_function": "softmax",
        "norm_head": False,  # (the converter stored it normalised)
    }


def _phimoe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Phi-3.5-MoE (llama.cpp's PhiMoeModel, a Phi3MiniModel: its keys, LongRoPE as factor tensors with the converter's
    attention factor, nothing permuted, the experts stacked). Computed as the checkpoint is (transformers'
    modeling_phimoe: LayerNorms with biases, SparseMixer's choice with PhimoeConfig's router_jitter_noise 0.01, which
    the file does not state), not as llama.cpp's graph shortcuts it (RMS norms, a renormalised softmax top-2)."""
    out = _phi3(meta, tensors, cfg)
    rope = out.get("rope_scaling")
    if rope is not None:  # family_phimoe reads LongRoPE's attention factor as short_mscale = long_mscale
        factor = rope.pop("attention_factor", None)
        if factor is None:
            scale = cfg["max_position_embeddings"] / out["original_max_position_embeddings"]
            original = out["original_max_position_embeddings"]
            factor = float(np.sqrt(1 + np.log(scale) / np.log(original))) if scale > 1 else 1.0
        rope |= {"short_mscale": factor, "long_mscale": factor}
    return {
        **out,
        "model_type": "phimoe",
        "num_local_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "router_jitter_noise": 0.01,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "lm_head_bias": "output.bias" in tensors,
    }


def _laguna(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Poolside Laguna (llama.cpp's LagunaModel: a TextModel, nothing permuted): query heads per layer
    (attention.head_count as an array), the softplus output gate per head or per channel as attn_gate's rows say,
    sliding layers by attention.sliding_window_pattern or llama.cpp's XS.2 default (every 4th layer full, the first
    of each period), the full layers' rope (base, width, YaRN) and the sliding ones' (rope.freq_base_swa,
    rope.dimension_count_swa, plain), leading dense layers, a sigmoid router with its bias renormalised and scaled
    beside one shared expert. Its router's logit cap is not in the file (llama.cpp has none)."""
    layers, head_dim = cfg["num_hidden_layers"], _head_dim(meta, cfg)
    stated = meta.need("attention.head_count")
    heads = [int(h) for h in stated] if isinstance(stated, (list, tuple)) else [int(stated)] * layers
    if len(heads) != layers:
        raise UnsupportedModelError(f"{meta.label}laguna.attention.head_count has {len(heads)} values for {layers}")
    gates = [tensors.get(f"blk.{i}.attn_gate.weight") for i in range(layers)]
    if any(g is None for g in gates):  # (llama.cpp's laguna graph needs every layer's)
        raise UnsupportedModelError(f"{meta.label}laguna without an attn_gate tensor in every layer is not implemented")
    widths = {int(g.shape[1]) // h for g, h in zip(gates, heads)}
    if widths not in ({1}, {head_dim}):  # (llama.cpp reads each layer's; the checkpoints gate every layer alike)
        raise UnsupportedModelError(f"{meta.label}laguna attn_gate rows mix per-head and per-channel gates")
    window = int(meta.get("attention.sliding_window") or 0)
    pattern = meta.get("attention.sliding_window_pattern", 4)
    if isinstance(pattern, (list, tuple)):
        slides = [bool(p) for p in pattern]
    else:
        slides = [int(pattern) == 0 or i % int(pattern) != 0 for i in range(layers)]
    if len(slides) != layers:
        raise UnsupportedModelError(f"{meta.label}laguna.attention.sliding_window_pattern has {len(slides)} flags")
    full = {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]}
    full["partial_rotary_factor"] = _rotary_fraction(meta, head_dim)
    local_dims = int(meta.get("rope.dimension_count_swa") or head_dim)
    local = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa") or cfg["rope_theta"])}
    if int(meta.get("expert_gating_func") or 2) != 2:
        raise UnsupportedModelError(f"{meta.label}laguna.expert_gating_func other than sigmoid (2) is not implemented")
    if not meta.get("expert_weights_norm", True) or int(meta.get("expert_shared_count") or 1) != 1:
        raise UnsupportedModelError(
            f"{meta.label}laguna experts unnormalised or shared other than once: not implemented"
        )
    dense = int(meta.get("leading_dense_block_count") or 0)
    return {
        "model_type": "laguna",
        "head_dim": head_dim,
        "num_attention_heads": heads[0],
        "num_attention_heads_per_layer": heads,
        "gating": True if widths == {1} else "per-element",
        "sliding_window": window or None,
        "layer_types": ["sliding_attention" if s and window else "full_attention" for s in slides],
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {**local, "partial_rotary_factor": local_dims / head_dim},
        },
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length")),
        "shared_expert_intermediate_size": int(meta.need("expert_shared_feed_forward_length")),
        "moe_routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(layers)],
    }


def _hy_v3(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """HY-V3 (llama.cpp's HYV3Model: a TextModel, nothing permuted; its prediction layers appended past the stack,
    counted by nextn_predict_layers). A layer is a mixture where the file holds its router (llama.cpp's graph asks
    no key); the router's bias is a bare exp_probs_b; the weights renormalised (expert_weights_norm, which the
    converter writes) and scaled; the shared experts' width a whole number of expert widths."""
    if int(meta.get("expert_gating_func") or 2) != 2:
        raise UnsupportedModelError(f"{meta.label}hy_v3.expert_gating_func other than sigmoid (2) is not implemented")
    if not meta.get("expert_weights_norm", False):  # (absent: llama.cpp does not renormalise)
        raise UnsupportedModelError(f"{meta.label}hy_v3 without expert_weights_norm is not implemented")
    inner = int(meta.scalar("expert_feed_forward_length"))
    shared = int(meta.get("expert_shared_feed_forward_length") or 0)
    if shared % inner:
        raise UnsupportedModelError(f"{meta.label}hy_v3 shared experts {shared} wide, not a multiple of {inner}")
    layers = cfg["num_hidden_layers"]
    out: dict[str, Any] = {
        "model_type": "hy_v3",
        "head_dim": _head_dim(meta, cfg),
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "num_shared_experts": shared // inner,
        "moe_intermediate_size": inner,
        "router_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "mlp_layer_types": ["sparse" if f"blk.{i}.ffn_gate_inp.weight" in tensors else "dense" for i in range(layers)],
    }
    rope = stated_rope_scaling(meta)
    if rope:
        out["rope_scaling"] = rope
    return out


MOE_BUILDERS = {
    "bailingmoe": _ling1,
    "hy_v3": _hy_v3,
    "laguna": _laguna,
    "deepseek": _deepseek_moe,
    "phimoe": _phimoe,
    "kimi-linear": _kimi_linear,
    "mimo2": _mimo2,
    "cohere2moe": _cohere2moe,
    "dbrx": _dbrx,
    "afmoe": _afmoe,
    "deepseek32": _dsa,
    "glm-dsa": _dsa,
    "exaone-moe": _exaone_moe,
    "minicpm3": _minicpm3,
    "mistral4": _mistral4,
}
