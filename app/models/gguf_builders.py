"""GGUF config builders of the families added after gemma / phi3 / glm4 / deepseek2 / gpt-oss / mistral3
(gguf_config.py holds those, the metadata reader and the helpers used here): GLM-4.5, SmolLM3, Granite 3
(dense, MoE), OLMo 2 / 3, ERNIE 4.5, EXAONE 4, Command R7B, Qwen2-VL, Qwen3-VL, MiniMax-M2, Seed-OSS and
Hunyuan dense, each as llama.cpp's converter writes it; the Mamba-2 hybrids' are in gguf_mamba_builders.py.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.gguf_config import _head_dim, _layer_types, _Meta, _rotary_fraction
from lantern.app.models.gguf_dense_builders import DENSE_BUILDERS, qkv_bias
from lantern.app.models.gguf_encoder import ENCODER_BUILDERS
from lantern.app.models.gguf_gpt_builders import GPT_BUILDERS
from lantern.app.models.gguf_granite_builders import GRANITE_BUILDERS
from lantern.app.models.gguf_llama_builders import LLAMA_RELATIVE_BUILDERS
from lantern.app.models.gguf_mamba_builders import MAMBA_BUILDERS
from lantern.app.models.gguf_moe_builders import MOE_BUILDERS
from lantern.app.models.gguf_rope import rope_freqs_scaling, stated_rope_scaling
from lantern.app.models.gguf_step_builder import STEP_BUILDERS
from lantern.app.models.spec import UnsupportedModelError


def _glm4moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """GLM-4.5 / 4.6 / 4.7 (llama.cpp's Glm4MoeModel): Llama's tensors unpermuted (NeoX rope on the
    first rope.dimension_count dims of each head), biases and q/k norms where their tensors are,
    DeepSeek-V3's sigmoid router with its keys (deepseek2's names), block_count counting the
    multi-token-prediction layers after the stack (_common takes nextn_predict_layers off)."""
    head_dim = _head_dim(meta, cfg)
    if int(meta.get("expert_gating_func") or 2) != 2:
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.expert_gating_func other than sigmoid is not implemented")
    out: dict[str, Any] = {
        "model_type": "glm4_moe",
        "head_dim": head_dim,
        "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "use_qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        **_v3_router_keys(meta),
        "n_group": int(meta.get("expert_group_count") or 1),
        "topk_group": int(meta.get("expert_group_used_count") or 1),
        "hidden_act": "silu",
    }
    if not cfg["intermediate_size"]:  # every layer a mixture: the dense width is never used
        out["intermediate_size"] = out["moe_intermediate_size"]
    rope = stated_rope_scaling(meta)
    if rope:
        partial = out["partial_rotary_factor"]
        out["rope_parameters"] = {**rope, "rope_theta": cfg["rope_theta"], "partial_rotary_factor": partial}
    return out


def _bailingmoe2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Ling / Ring 2.0 and Sarvam-30B (llama.cpp's BailingMoeV2Model / SarvamMoEModel: bailingmoe2): GLM-4.5's maths
    with q/k/v in one attn_qkv (as stored: the converter is a TextModel), per-head q/k norms, the rope on
    rope.dimension_count dims, DeepSeek-V3's sigmoid router (its expert groups as TextModel writes them) and shared
    experts."""
    out = _glm4moe(meta, tensors, cfg)
    shared = meta.get("expert_shared_feed_forward_length")  # (each shared expert's width in llama.cpp's graph)
    if shared is not None and int(shared) != out["moe_intermediate_size"]:
        raise UnsupportedModelError(
            f"{meta.label}bailingmoe2.expert_shared_feed_forward_length={shared} (not expert_feed_forward_length) "
            "is not implemented"
        )
    if "blk.0.attn_qkv.bias" in tensors:  # (llama.cpp's bailingmoe2 loads no such tensor: it refuses the file)
        raise UnsupportedModelError(f"{meta.label}bailingmoe2 with attn_qkv biases is not implemented")
    return out


def _dots1(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """dots.llm1 (llama.cpp's Dots1Model, a Qwen2MoeModel: q/k unpermuted, per-head q/k norms; the router's keys as
    DeepSeek's). Its graph routes without expert groups and attends to all on every layer; a file that does not
    state the sigmoid gating (the converter writes it from config.json's scoring_func) is refused."""
    if int(meta.get("expert_gating_func") or 0) != 2:
        raise UnsupportedModelError(f"{meta.label}dots1.expert_gating_func other than sigmoid (2) is not implemented")
    if int(meta.get("expert_group_count") or 1) != 1:
        raise UnsupportedModelError(f"{meta.label}dots1.expert_group_count other than 1 is not implemented")
    return _with_rope(
        {
            "model_type": "dots1",
            "head_dim": _head_dim(meta, cfg),
            **_v3_router_keys(meta),
            "sliding_window": None,  # (llama.cpp's dots1 graph: full attention on every layer)
            "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_llama_moe
        },
        stated_rope_scaling(meta),
        cfg,
    )


def _v3_router_keys(meta: _Meta) -> dict[str, Any]:
    """The config.json keys of DeepSeek-V3's router as llama.cpp's converters state them (GLM-4.5, dots.llm1)."""
    return {
        "first_k_dense_replace": int(meta.get("leading_dense_block_count") or 0),
        "n_routed_experts": int(meta.need("expert_count")),
        "n_shared_experts": int(meta.get("expert_shared_count") or 0),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "moe_intermediate_size": int(meta.need("expert_feed_forward_length")),
        "routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
    }


def _smollm3(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """SmolLM3 (llama.cpp's SmolLM3Model, a LlamaModel: q/k permuted as Llama's). llama.cpp's graph
    skips the rope on every 4th layer (its n_no_rope_layer_step, fixed: no key states it), which is
    SmolLM3Config's default interval; transformers has no GGUF reader for it."""
    out: dict[str, Any] = {
        "model_type": "smollm3",
        "head_dim": _head_dim(meta, cfg),
        "no_rope_layer_interval": 4,
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_smollm3
    }
    return _with_rope(out, stated_rope_scaling(meta), cfg)


def _arcee(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Arcee AFM (llama.cpp's ArceeModel, a LlamaModel: q/k permuted, its YaRN keys; the MLP ffn_up / ffn_down)."""
    out: dict[str, Any] = {
        "model_type": "arcee",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_arcee
    }
    return _with_rope(out, stated_rope_scaling(meta), cfg)


def _llama4(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Llama 4 (llama.cpp's Llama4Model: q/k unpermuted; the dense MLP's width as feed_forward_length, the experts'
    as expert_feed_forward_length; the llama3 rope as rope_freqs). llama.cpp's graph fixes what no key states:
    every 4th layer rope-less and attending to all (the others in chunks of 8192), the query temperature's floor
    8192 and scale 0.1, q/k norms except on the 128-expert model (Maverick) -- Llama4TextConfig's defaults, and
    Maverick's use_qk_norm false. A file stating sliding_window 0 (rope everywhere but on the last layer) is refused."""
    if meta.get("attention.sliding_window") == 0:
        raise UnsupportedModelError(f"{meta.label}llama4.attention.sliding_window=0 is not implemented")
    experts = int(meta.need("expert_count"))
    out: dict[str, Any] = {
        "model_type": "llama4_text",
        "head_dim": _head_dim(meta, cfg),
        "num_local_experts": experts,
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "interleave_moe_layer_step": int(meta.need("interleave_moe_layer_step")),
        "intermediate_size": int(meta.need("expert_feed_forward_length")),
        "intermediate_size_mlp": cfg["intermediate_size"],
        "use_qk_norm": experts != 128,
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_llama4
    }
    return _with_rope(out, rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)), cfg)


def _with_rope(out: dict[str, Any], rope: dict[str, Any] | None, cfg: dict[str, Any]) -> dict[str, Any]:
    """`out` with the file's rope scaling as rope_parameters (at the file's base), where it has one."""
    return {**out, "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]}} if rope else out


def _apertus(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Apertus (llama.cpp's ApertusModel, a LlamaModel with undo_permute off: q/k as stored; the llama3 rope as
    rope_freqs, none for a plain rope; xIELU's scalars in metadata: family_apertus.gguf_tensors reads them)."""
    rope = rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)) or {"rope_type": "default"}
    return {
        "model_type": "apertus",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_apertus
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},  # (ApertusConfig's default is llama3's)
    }


def _olmo2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """OLMo 2 and OLMo 3 (llama.cpp's Olmo2Model writes both as olmo2; q/k not permuted). A sliding
    window makes it OLMo 3: its layers from attention.sliding_window_pattern (default: every 4th full),
    a stated rope scaling for the full layers, the sliding ones on a plain rope of rope.freq_base_swa (the
    converter writes transformers' sliding base there; llama.cpp's olmo2 graph uses freq_base for both,
    which differs only for a config with a flat rope_theta other than 500000), else the same base."""
    window = meta.get("attention.sliding_window")
    out: dict[str, Any] = {"model_type": "olmo3" if window else "olmo2", "head_dim": _head_dim(meta, cfg)}
    rope = stated_rope_scaling(meta) or {"rope_type": "default"}
    if window:
        out["sliding_window"] = int(window)
        out["layer_types"] = _layer_types(meta, cfg["num_hidden_layers"], 4, True)
        theta = cfg["rope_theta"]
        plain = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa") or theta)}
        out["rope_parameters"] = {"full_attention": {**rope, "rope_theta": theta}, "sliding_attention": plain}
    elif rope["rope_type"] != "default":
        out["rope_parameters"] = {**rope, "rope_theta": cfg["rope_theta"]}
    return out


def _olmoe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """OLMoE (llama.cpp's OlmoeModel: q/k not permuted, the experts stacked; its graph routes by the softmax's
    top-k without renormalising, as the released norm_topk_prob false)."""
    return {
        "model_type": "olmoe",
        "head_dim": _head_dim(meta, cfg),
        "num_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "norm_topk_prob": False,
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_olmo
    }


def _ernie(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """ERNIE 4.5 (llama.cpp's Ernie4_5Model / Ernie4_5MoeModel: q/k not permuted, its rope rotating pairs
    as transformers' does). The mixture: sparse from leading_dense_block_count on, every
    interleave_moe_layer_step-th layer, to the last (the converter writes no end index)."""
    out: dict[str, Any] = {
        "model_type": "ernie4_5" if meta.arch == "ernie4_5" else "ernie4_5_moe",
        "head_dim": _head_dim(meta, cfg),
        "use_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_ernie
    }
    if meta.arch != "ernie4_5":
        out.update(
            moe_num_experts=int(meta.need("expert_count")),
            moe_k=int(meta.need("expert_used_count")),
            moe_layer_interval=int(meta.get("interleave_moe_layer_step") or 1),
            moe_layer_start_index=int(meta.get("leading_dense_block_count") or 0),
            moe_layer_end_index=-1,
            moe_intermediate_size=int(meta.need("expert_feed_forward_length")),
            moe_num_shared_experts=_ernie_shared(meta, tensors),
        )
    return _with_rope(out, stated_rope_scaling(meta), cfg)


def _ernie_shared(meta: _Meta, tensors: dict[str, Any]) -> int:
    """expert_shared_count, which the converter writes only when the HF config states it; else the shared
    experts' width (their tensors' rows) over one expert's, as llama.cpp sizes them from the tensors."""
    count = meta.get("expert_shared_count")
    if count is not None:
        return int(count)
    up = next((t for name, t in tensors.items() if name.endswith(".ffn_up_shexp.weight")), None)
    return 0 if up is None else int(up.shape[1]) // int(meta.need("expert_feed_forward_length"))


def _exaone4(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 4 (llama.cpp's Exaone4Model: q/k not permuted; a llama3 rope as a rope_freqs tensor, the
    32B's). A window makes the pattern's sliding layers slide and its global layers NoPE."""
    window = meta.get("attention.sliding_window")
    out: dict[str, Any] = {"model_type": "exaone4", "head_dim": _head_dim(meta, cfg), "sliding_window": None}
    if window:
        out["sliding_window"] = int(window)
        out["layer_types"] = _layer_types(meta, cfg["num_hidden_layers"], 4, True)
    else:
        out["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
    return _with_rope(out, rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)), cfg)


def _cohere2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Command R7B / A (llama.cpp's Cohere2Model: q/k not permuted, its rope on pairs as transformers';
    its graph slides three layers of four, with no key for the pattern, and ropes only those)."""
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "cohere2",
        "head_dim": head_dim,
        "layer_norm_eps": cfg["rms_norm_eps"],
        "logit_scale": float(meta.get("logit_scale") or 1.0),
        "sliding_window": int(meta.need("attention.sliding_window")),
        "layer_types": _layer_types(meta, cfg["num_hidden_layers"], 4, True),
        "rotary_pct": _rotary_fraction(meta, head_dim),  # refused by family_cohere unless 1
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_cohere
    }


def _qwen3next(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5 / Qwen3.5-MoE (llama.cpp's Qwen3NextModel and its Qwen3_5 subclasses): the
    linear-attention sizes under ssm.* (state_size: key head dim, group_count: key heads,
    time_step_rank: value heads, inner_size: all value dims), which layers recur
    (attention.recurrent_layers, else every full_attention_interval-th layer attends), rope on
    rope.dimension_count dims of each head; gguf_linear_layout tells family_qwen3_next how the
    converter laid the projections out (Qwen3.5's value heads tiled)."""
    head_dim = _head_dim(meta, cfg)
    layers, v_heads = cfg["num_hidden_layers"], int(meta.need("ssm.time_step_rank"))
    recurrent = meta.get("attention.recurrent_layers")
    if recurrent is not None:
        kinds = ["linear_attention" if r else "full_attention" for r in list(recurrent)[:layers]]
    else:
        interval = int(meta.get("full_attention_interval") or 4)
        kinds = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    model_type = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}[meta.arch]
    out: dict[str, Any] = {
        "model_type": model_type,
        # llama.cpp's first qwen3next files kept Qwen3-Next's qkvz whole (ssm_in), as the checkpoint has it
        "gguf_linear_layout": "qwen3next-ssm_in" if any(n.endswith(".ssm_in.weight") for n in tensors) else meta.arch,
        "head_dim": head_dim,
        "layer_types": kinds,
        "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        "linear_conv_kernel_dim": int(meta.need("ssm.conv_kernel")),
        "linear_key_head_dim": int(meta.need("ssm.state_size")),
        "linear_num_key_heads": int(meta.need("ssm.group_count")),
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": int(meta.need("ssm.inner_size")) // v_heads,
        "attention_bias": "blk.0.attn_q.bias" in tensors or "blk.3.attn_q.bias" in tensors,  # refused
    }
    if meta.get("expert_count"):
        out.update(
            num_experts=int(meta.need("expert_count")),
            num_experts_per_tok=int(meta.need("expert_used_count")),
            moe_intermediate_size=int(meta.need("expert_feed_forward_length")),
            shared_expert_intermediate_size=int(meta.get("expert_shared_feed_forward_length") or 0),
            norm_topk_prob=True,  # llama.cpp's graph renormalises the top-k weights for these archs
        )
    rope = stated_rope_scaling(meta)
    if rope:
        out["rope_parameters"] = {
            **rope,
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": out["partial_rotary_factor"],
        }
    return out


def _lfm2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """LFM2 (llama.cpp's LFM2Model: no q/k permutation): a layer without KV heads is a short-conv layer,
    shortconv.l_cache its kernel, feed_forward_length the MLP's width already adjusted; LFM2-MoE's expert
    keys (LFM2MoeModel)."""
    for key, value in (("attention.sliding_window", None), ("attention.causal", True)):
        if meta.get(key, value) != value:  # LFM2.5's audio tokenizer / the bidirectional embedding models
            raise UnsupportedModelError(f"{meta.label}{meta.arch}.{key}={meta.get(key)} is not implemented for lfm2")
    kv = meta.get("attention.head_count_kv")
    kinds = ["conv" if not h else "full_attention" for h in kv] if isinstance(kv, (list, tuple)) else None
    moe: dict[str, Any] = {}
    if meta.arch == "lfm2moe":  # llama.cpp's LFM2MoeModel: a sigmoid router, the top-k renormalised
        gating = meta.get("expert_gating_func")
        if gating not in (None, 2):
            raise UnsupportedModelError(f"{meta.label}{meta.arch}.expert_gating_func={gating}: only sigmoid (2) is")
        moe = {
            "model_type": "lfm2_moe",
            "num_experts": int(meta.need("expert_count")),
            "num_experts_per_tok": int(meta.need("expert_used_count")),
            "moe_intermediate_size": int(meta.need("expert_feed_forward_length")),
            "num_dense_layers": int(meta.get("leading_dense_block_count") or 0),
            "use_expert_bias": any(n.endswith("exp_probs_b.bias") for n in tensors),
            "routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
            "norm_topk_prob": True,
        }
    return {
        "model_type": "lfm2",
        "head_dim": _head_dim(meta, cfg),
        "layer_types": (kinds or ["full_attention"] * cfg["num_hidden_layers"])[: cfg["num_hidden_layers"]],
        "conv_L_cache": int(meta.need("shortconv.l_cache")),
        "conv_bias": any(n.endswith("shortconv.in_proj.bias") for n in tensors),
        "block_auto_adjust_ff_dim": False,
        "norm_eps": cfg["rms_norm_eps"],
        **moe,
    }


def _gemma4(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4 (llama.cpp's Gemma4Model: no q/k permutation, norms as stored). The sliding layers' shape
    is key_length_swa and the first sliding layer's KV heads, the full layers' key_length and theirs (a
    per-layer head_count_kv); V is K's projection on the full layers when they have no attn_v. The full
    layers' proportional rope is rope_freqs: divisor 1 for the pairs that turn, 1e30 for the rest."""
    layers = cfg["num_hidden_layers"]
    pattern = meta.get("attention.sliding_window_pattern")
    sliding = [bool(x) for x in pattern][:layers] if isinstance(pattern, (list, tuple)) else [True] * layers
    sliding[-1] = False
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    full = [i for i, s in enumerate(sliding) if not s]
    kv = meta.get("attention.head_count_kv")
    kv_full = int(kv[full[0]]) if isinstance(kv, (list, tuple)) else cfg["num_key_value_heads"]
    kv_swa = int(kv[sliding.index(True)]) if isinstance(kv, (list, tuple)) and True in sliding else kv_full
    global_dim = int(meta.need("attention.key_length"))
    if int(meta.get("attention.value_length") or global_dim) != global_dim:
        raise UnsupportedModelError(f"{meta.label}gemma4.attention.value_length differs from its key_length")
    widths = meta.get("feed_forward_length")
    shared = int(meta.get("attention.shared_kv_layers") or 0)
    double = isinstance(widths, (list, tuple)) and len(set(widths)) > 1
    inner = cfg["intermediate_size"]
    if double and any(int(w) != (2 if i >= layers - shared else 1) * inner for i, w in enumerate(widths)):
        raise UnsupportedModelError(f"{meta.label}gemma4.feed_forward_length={list(widths)} is not implemented")
    out: dict[str, Any] = {
        "model_type": "gemma4_text",
        "num_key_value_heads": kv_swa,
        "head_dim": int(meta.get("attention.key_length_swa") or global_dim),
        "layer_types": types,
        "per_layer_config": {str(i): {"head_dim": global_dim, "num_key_value_heads": kv_full} for i in full},
        # (a --fuse-qkv file has attn_qkv wherever a layer has q, k and v)
        "attention_k_eq_v": not {f"blk.{full[0]}.attn_v.weight", f"blk.{full[0]}.attn_qkv.weight"} & set(tensors),
        "sliding_window": int(meta.get("attention.sliding_window") or 512),
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": double,
        "hidden_size_per_layer_input": int(meta.get("embedding_length_per_layer_input") or 0),
        "final_logit_softcapping": meta.get("final_logit_softcapping"),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa", 10000.0))},
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": cfg["rope_theta"],
                "partial_rotary_factor": _turning_fraction(meta, tensors, global_dim),
            },
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": cfg["tie_word_embeddings"],
    }
    ple = tensors.get("per_layer_token_embd.weight")
    if ple is not None:
        out["vocab_size_per_layer_input"] = int(ple.shape[1])
    if meta.get("expert_count"):
        out.update(
            enable_moe_block=True,
            num_experts=int(meta.need("expert_count")),
            top_k_experts=int(meta.need("expert_used_count")),
            moe_intermediate_size=int(meta.need("expert_feed_forward_length")),
        )
    return out


def _qwen3vl(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-VL's language model (llama.cpp's Qwen3VLTextModel / Qwen3VLMoeTextModel: Qwen3's tensors
    unpermuted and keys, plus n_deepstack_layers and the rope's dimension_sections, which are Qwen3's rope
    for text); the MoE renormalises its top-k always (transformers' router, llama.cpp's graph)."""
    if "blk.0.attn_q.bias" in tensors:
        raise UnsupportedModelError(f"{meta.label}q/k/v biases in a {meta.arch} file are not implemented")
    out: dict[str, Any] = {
        "model_type": "qwen3_vl_text",
        "head_dim": _head_dim(meta, cfg),
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }
    if meta.arch == "qwen3vlmoe":
        out.update(
            model_type="qwen3_vl_moe_text",
            num_experts=int(meta.need("expert_count")),
            num_experts_per_tok=int(meta.need("expert_used_count")),
            moe_intermediate_size=int(meta.need("expert_feed_forward_length")),
        )
        if not cfg["intermediate_size"]:  # every layer a mixture: the dense width is never used
            out["intermediate_size"] = out["moe_intermediate_size"]
    return out


def _qwen2vl(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen2-VL / Qwen2.5-VL's language model (llama.cpp's Qwen2VLModel: Qwen2's tensors unpermuted and keys,
    plus the rope's dimension_sections, which are Qwen2's rope for text)."""
    return {"model_type": "qwen2", "head_dim": _head_dim(meta, cfg)}


def _minimax_m2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniMax-M2 (llama.cpp's MiniMaxM2Model): Llama's tensors unpermuted, the whole-projection q/k norms,
    rope.dimension_count as rotary_dim, every layer's experts under a sigmoid router with its bias
    (exp_probs_b), which llama.cpp's graph always renormalises."""
    gating = meta.get("expert_gating_func")
    if gating not in (None, 2):  # llama.cpp's ExpertGatingFuncType: 1 softmax, 2 sigmoid
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.expert_gating_func={gating}: only sigmoid (2) is")
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "minimax_m2",
        "head_dim": head_dim,
        "rotary_dim": int(meta.get("rope.dimension_count") or head_dim),
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        "num_local_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "intermediate_size": int(meta.get("expert_feed_forward_length") or cfg["intermediate_size"]),
    }


def _hunyuan_dense(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Hunyuan dense (llama.cpp's HunYuanModel, a plain TextModel: q/k unpermuted). Its converter writes the
    NTK-alpha base already stretched (rope.freq_base = theta * alpha ** (d / (d - 2)), scaling type none), so
    the rope is plain; the q/k norms after the rope are the architecture's (family_hunyuan)."""
    return {
        "model_type": "hunyuan_v1_dense",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_hunyuan (o_proj's too)
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }


def _hunyuan_moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Hunyuan MoE (llama.cpp's HunYuanMoEModel: Hunyuan dense's attention and rope keys, the experts stacked, the
    shared MLP as ffn_*_shexp; its graph renormalises the softmax's top-k as transformers does)."""
    shared = int(meta.get("expert_shared_count") or 1)
    if shared != 1:
        raise UnsupportedModelError(f"{meta.label}hunyuan-moe.expert_shared_count={shared} is not implemented")
    return {
        **_hunyuan_dense(meta, tensors, cfg),
        "model_type": "hunyuan_v1_moe",
        "num_experts": int(meta.need("expert_count")),
        "moe_topk": int(meta.need("expert_used_count")),
        "intermediate_size": int(meta.need("expert_shared_feed_forward_length")),
        "moe_intermediate_size": int(meta.need("expert_feed_forward_length")),  # (refused unless the same)
    }


def _seed_oss(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Seed-OSS (llama.cpp's SeedOssModel, a plain TextModel: q/k unpermuted); biases where their tensors are."""
    return {
        "model_type": "seed_oss",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "attention_out_bias": "blk.0.attn_output.bias" in tensors,  # refused by spec (an o_proj bias)
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }


def _jais2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Jais 2 (llama.cpp's Jais2Model, a plain TextModel: q/k unpermuted; LayerNorms with biases, their eps as
    attention.layer_norm_epsilon; the ungated relu^2 MLP as ffn_up / ffn_down); biases where their tensors are."""
    return {
        "model_type": "jais2",
        "head_dim": _head_dim(meta, cfg),
        "hidden_act": "relu2",
        "layer_norm_eps": cfg["rms_norm_eps"],  # (_common's: the LayerNorm eps where no RMS eps is stated)
        "attention_bias": qkv_bias(tensors),
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }


def _turning_fraction(meta: _Meta, tensors: dict[str, Any], head_dim: int) -> float:
    """The share of the full layers' rope pairs that turn, from rope_freqs (1 = turns, 1e30 = still)."""
    t = tensors.get("rope_freqs.weight")
    if t is None:
        return 1.0
    import numpy as np

    divisors = np.asarray(t.data, dtype=np.float64).reshape(-1)
    turning = int((divisors == 1.0).sum())
    if divisors.size != head_dim // 2 or not (divisors[:turning] == 1.0).all() or (divisors[turning:] < 1e29).any():
        raise UnsupportedModelError(
            f"{meta.label}tensor rope_freqs.weight is not a proportional rope (1 then 1e30 per pair); not implemented"
        )
    return 2 * turning / head_dim


BUILDERS = {
    "gemma4": _gemma4,
    "lfm2": _lfm2,
    "lfm2moe": _lfm2,
    "qwen3next": _qwen3next,
    "qwen35": _qwen3next,
    "qwen35moe": _qwen3next,
    "qwen2vl": _qwen2vl,
    "qwen3vl": _qwen3vl,
    "qwen3vlmoe": _qwen3vl,
    "minimax-m2": _minimax_m2,
    "seed_oss": _seed_oss,
    "jais2": _jais2,
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-moe": _hunyuan_moe,
    "glm4moe": _glm4moe,
    "bailingmoe2": _bailingmoe2,
    "dots1": _dots1,
    "smollm3": _smollm3,
    "arcee": _arcee,
    "llama4": _llama4,
    "apertus": _apertus,
    **GRANITE_BUILDERS,
    **STEP_BUILDERS,
    **LLAMA_RELATIVE_BUILDERS,
    **MAMBA_BUILDERS,
    **MOE_BUILDERS,
    **DENSE_BUILDERS,
    **GPT_BUILDERS,
    **ENCODER_BUILDERS,
    "olmo2": _olmo2,
    "olmoe": _olmoe,
    "ernie4_5": _ernie,
    "ernie4_5-moe": _ernie,
    "exaone4": _exaone4,
    "cohere2": _cohere2,
}
