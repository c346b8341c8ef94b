"""Architectures whose maths is another family's, stated in config.json under other key names and defaults
(transformers' own classes for them are that family's model on a config subclass):

- InternLM3 (`internlm3`): Llama; `qkv_bias` / `bias` are attention_bias / mlp_bias (both refused, as Llama's).
- IQuest-Coder (`iquestcoder`): Llama; the original code's clip_qkv and sliding window are refused, as
  IQuestCoderConfig refuses them.
- Sarvam-30B (`sarvam_moe`): GLM-4.5's attention and mixture with the rope over the whole head, q/k norms on.
- Ling / Ring 2.0 (`bailing_moe` with BailingMoeV2's keys, a sigmoid router: remote code, no transformers class;
  mlx_lm's bailing_moe reads them): Sarvam-30B's layer and names with the rope on part of the head. Ling 1.x /
  Ring-lite (the same model_type, a softmax router): DeepSeek-MoE's layer (q/k/v biases, a partial rope) with the
  head's columns L2-normalised (norm_head); their MLP biases and q/k norms are refused.
- Sarvam-105B (`sarvam_mla`): DeepSeek-V3 (MLA, one expert group); the original config's `deepseek_yarn` is YaRN.
- Youtu-LLM (`youtu`, and `youtu_llm` as its released folders name it): DeepSeek-V3's latent attention over a
  dense SwiGLU MLP in every layer.
- Gemma 4 unified's language model (`gemma4_unified_text`): Gemma 4's text layers without per-layer embeddings
  or experts.
- Kimi K2 / K2-Thinking (`kimi_k2`) and JoyAI-LLM-Flash (`joyai_llm_flash`): DeepSeek-V3 itself (as mlx_lm maps
  them). MiMo-7B (`mimo`): Qwen2, its prediction layers skipped.
- MiniCPM3 (`minicpm3`): the same, the rope on halves (not pairs), with muP's scalars: embeddings times scale_emb,
  each sublayer's output times scale_depth / sqrt(layers), the logits divided by hidden_size / dim_model_base; its
  LongRoPE (MiniCPM3-4B's) with the factors transformers' shared rope update picks.
- MiniCPM 1 / 2 / 4 / 4.1 (`minicpm`: remote code, openbmb's modeling_minicpm.py): Granite's layer, muP's scalars as
  Granite's four (the query scale head_dim ** -0.5); its LongRoPE as its remote code builds it, InfLLM v2's sparse
  attention (sparse_config) served below dense_len, where the remote code attends densely.
- InternLM2 / 2.5 (`internlm2`: remote code modeling_internlm2.py): Llama under other tensor names, q/k/v fused in
  one matrix grouped by KV head (family_internlm2 regroups them).

spec.ModelConfig.from_hf renames the keys (`same_as`), fills the config class's defaults where they differ from
the family's, then reads the config as the family's model_type; the ModelConfig keeps the original name.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models import family_hunyuan_remote
from lantern.app.models.errors import refuse
from lantern.app.models.rope_config import longrope_scaling

logger = logging.getLogger(__name__)

# model_type -> ({this config's key: the family's key}, this config class's defaults where they differ from its
# family's); the family is the model_type its ARCHITECTURES entry names as "same_as"
RENAMED: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "internlm3": (
        {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
        {
            "vocab_size": 128512,
            "intermediate_size": 10240,
            "num_hidden_layers": 48,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-5,
        },
    ),
    "iquestcoder": (
        {},
        {
            "vocab_size": 76800,
            "hidden_size": 5120,
            "intermediate_size": 27648,
            "num_hidden_layers": 80,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
        },
    ),
    "sarvam_moe": (
        {
            "num_local_experts": "n_routed_experts",
            "num_experts": "n_routed_experts",
            "num_shared_experts": "n_shared_experts",
            "use_qkv_bias": "attention_bias",
            "num_mtp_layers": "num_nextn_predict_layers",
        },
        {
            "vocab_size": 262144,
            "intermediate_size": 8192,
            "num_hidden_layers": 19,
            "num_attention_heads": 64,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 8_000_000.0,
            "partial_rotary_factor": 1.0,  # (GLM-4.5 turns half of each head)
            "moe_intermediate_size": 1024,
            "num_experts_per_tok": 6,
            "routed_scaling_factor": 2.5,
            "use_qk_norm": True,
            "num_nextn_predict_layers": 0,
            "eos_token_id": 1,
        },
    ),
    "sarvam_mla": (
        {
            "num_local_experts": "n_routed_experts",
            "num_experts": "n_routed_experts",
            "num_shared_experts": "n_shared_experts",
            "num_mtp_layers": "num_nextn_predict_layers",
        },
        {
            "vocab_size": 262144,
            "hidden_size": 4096,
            "intermediate_size": 16384,
            "num_hidden_layers": 32,
            "num_attention_heads": 64,
            "n_routed_experts": 128,
            "q_lora_rank": None,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 0,
        },
    ),
    "youtu": (
        {},
        {
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 32,
            "num_attention_heads": 16,
            "max_position_embeddings": 131072,
            "bos_token_id": 128000,
            "eos_token_id": 128001,
            "tie_word_embeddings": True,
        },
    ),
}

RENAMED["youtu_llm"] = RENAMED["youtu"]
# Gemma4UnifiedTextConfig over Gemma4TextConfig (its per-layer embedding and expert keys are not its own: off)
RENAMED["gemma4_unified_text"] = (
    {},
    {"max_position_embeddings": 262144, "sliding_window": 1024, "use_bidirectional_attention": "vision"},
)
_GEMMA4_ONLY = ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block", "num_experts")
# Kimi K2 and JoyAI-LLM-Flash ship DeepSeek's own DeepseekV3Config (remote code) under their model_type
RENAMED["kimi_k2"] = RENAMED["joyai_llm_flash"] = ({}, {})
# MiMo-7B (XiaomiMiMo's remote MiMoConfig, a Qwen2Config): its prediction layers' count is not Qwen2's key
RENAMED["mimo"] = ({}, {"max_position_embeddings": 32768})
# Apertus 1.5's language model (Apertus1p5TextConfig, an ApertusConfig): its vocabulary extended by the visual and
# audio codes, its head possibly pruned to the text ids (output_vocab_size: extra_fields)
RENAMED["apertus1p5_text"] = ({}, {"vocab_size": 266752})
RENAMED["telechat3"] = ({}, {})  # (its released configs state every key; its YaRN: rope_config)
# XverseConfig's defaults (XVERSE-13B's shape; no KV heads key: every head its own, the rope's base 10000)
RENAMED["xverse"] = ({}, {"vocab_size": 100278, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6})
RENAMED["hunyuan"] = ({}, family_hunyuan_remote.DEFAULTS)  # (Tencent's HunYuanConfig: family_hunyuan_remote)

RENAMED["bailing_moe"] = (
    {
        "num_experts": "n_routed_experts",
        "num_shared_experts": "n_shared_experts",
        "use_qkv_bias": "attention_bias",
        "num_mtp_layers": "num_nextn_predict_layers",
    },
    {  # mlx_lm's ModelArgs defaults (the keys a Ling config always states have none)
        "partial_rotary_factor": 1.0,
        "use_qk_norm": False,
        "n_group": 1,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 0,
    },
)
# BailingMoeV2's keys whose other values are maths Lantern does not compute (mlx_lm's defaults are the first two's)
_BAILING_REFUSED = {
    "score_function": ("sigmoid", ""),  # (softmax: Ling 1.x, _ling1)
    "moe_router_enable_expert_bias": (True, " (a sigmoid router without its expert bias)"),
    "use_bias": (False, " (biases on o_proj and the MLPs)"),
    "norm_head": (False, " (a normalised output head)"),
    "moe_router_enable_shared_expert": (True, " (shared experts stated but switched off)"),
    "moe_router_enable_routed_scaling": (True, " (routed_scaling_factor stated but switched off)"),
}

RENAMED["minicpm3"] = (
    {},
    {
        "vocab_size": 73448,
        "hidden_size": 2560,
        "intermediate_size": 6400,
        "num_hidden_layers": 62,
        "num_attention_heads": 40,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
        "mlp_bias": False,
        "kv_lora_rank": 256,
        "q_lora_rank": 768,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "scale_emb": 12,
        "scale_depth": 1.4,
        "dim_model_base": 256,
    },
)

# The Llama-2-7B shape both remote configs below default to
_LLAMA_2 = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# MiniCPMConfig (openbmb's remote configuration_minicpm.py, MiniCPM 1 to 4.1 alike: MiniCPM4 adds mup_denominator,
# an Eagle head's, and sparse_config) over GraniteConfig's defaults; its muP scalars are family_config's
RENAMED["minicpm"] = (
    {},
    {
        **_LLAMA_2,
        "vocab_size": 32000,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "scale_emb": 1,
        "dim_model_base": 1,
        "scale_depth": 1,
    },
)
# InternLM2Config (remote configuration_internlm2.py): `bias` (on wqkv and wo) is on unless stated
RENAMED["internlm2"] = (
    {},
    {
        **_LLAMA_2,
        "vocab_size": 103168,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "bias": True,
    },
)

# YoutuConfig and MiniCPM3Config have none of DeepseekV3Config's mixture keys: whatever a config.json says of them,
# every layer is dense.
_MIXTURE_KEYS = (
    "n_shared_experts",
    "n_routed_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "norm_topk_prob",
    "moe_intermediate_size",
    "num_nextn_predict_layers",
    "num_mtp_layers",
)


def family_config(model_type: str, family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` (a `model_type` config.json) as a config.json of `family`, whose maths it is."""
    names, defaults = RENAMED[model_type]
    out = dict(cfg)
    for key, target in names.items():
        if key not in out:
            continue
        value = out.pop(key)
        if target in cfg and cfg[target] != value:  # (transformers would keep whichever it set last)
            raise refuse(key, value, f" beside {target}={cfg[target]!r}: two values for one setting")
        out[target] = value
    for key, value in defaults.items():
        out.setdefault(key, value)
    if model_type == "hunyuan":  # (the dense or the mixture class, by its experts)
        return family_hunyuan_remote.transformers_config(out)
    if model_type == "xverse":
        for key in ("num_experts", "quantization_bit"):  # (XVERSE-MoE's mixture; its own int4 / int8 layout)
            if out.get(key):
                raise refuse(key, out[key], " for xverse (XVERSE's dense Llama layers only)")
    if model_type == "iquestcoder":
        for key in ("clip_qkv", "use_sliding_window"):
            if out.get(key):
                raise refuse(key, out[key], " for iquestcoder (IQuestCoderConfig refuses it too)")
    if model_type == "sarvam_mla":
        out = _sarvam_mla_legacy(out)
    if model_type == "bailing_moe" and out.get("score_function", "softmax") == "softmax":
        return _ling1(out)  # (Ling 1.x: DeepSeek-MoE's maths)
    if model_type == "bailing_moe":
        out = _bailing(out)
    if model_type == "mimo":
        out.pop("num_nextn_predict_layers", None)
    if model_type == "gemma4_unified_text":
        out = {k: v for k, v in out.items() if k not in (*_GEMMA4_ONLY, "top_k_experts", "moe_intermediate_size")}
        out["hidden_size_per_layer_input"], out["enable_moe_block"] = 0, False
    if model_type in ("youtu", "youtu_llm", "minicpm3"):  # (no mixture keys in their config classes: all dense)
        out = {k: v for k, v in out.items() if k not in _MIXTURE_KEYS}
        out["n_routed_experts"], out["num_nextn_predict_layers"] = 0, 0
    if model_type == "minicpm3":  # (MiniCPM3Config has no rope_interleave: its attention turns halves)
        out["rope_interleave"] = False
        out["v_head_dim"] = out.get("v_head_dim") or out["hidden_size"] // out["num_attention_heads"]
        out["head_dim"] = out["qk_rope_head_dim"]  # (the rope's width, as MiniCPM3Config sets it: LongRoPE's factors)
    if model_type == "minicpm":
        out = _minicpm(out)
    if model_type == "internlm2":
        out = _internlm2(out)
    if model_type in ("minicpm3", "minicpm") and _longrope_of(out) is not None:  # (extra_fields reads it, the
        # family a plain rope)
        theta = _longrope_of(out).get("rope_theta") or out.get("rope_theta") or 10000.0
        out["rope_scaling"], out["rope_parameters"] = None, {"rope_type": "default", "rope_theta": theta}
    return {**out, "model_type": family}


def _pruned_head(cfg: dict[str, Any]) -> dict[str, Any]:
    """Apertus 1.5's output_vocab_size: the head's rows (the ids past them input-only), when fewer than the
    vocabulary's."""
    rows, vocab = cfg.get("output_vocab_size"), int(cfg["vocab_size"])
    if rows is None or int(rows) == vocab:
        return {}
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= vocab:
        raise refuse("output_vocab_size", rows, f" (between 1 and vocab_size, {vocab})")
    if cfg.get("tie_word_embeddings"):  # (a tied head is the embedding: all of its rows)
        raise refuse("output_vocab_size", rows, " with tie_word_embeddings")
    return {"head_rows": rows}


def extra_fields(model_type: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields a renamed architecture sets beyond its family's: MiniCPM3's muP scalars, MiniCPM's
    LongRoPE and the length it attends densely within, Ling 1.x's normalised head."""
    if model_type == "bailing_moe":
        return {"norm_head": bool(cfg.get("norm_head"))}
    if model_type == "minicpm":
        return _minicpm_fields({**RENAMED[model_type][1], **cfg})
    if model_type == "apertus1p5_text":
        return _pruned_head({**RENAMED[model_type][1], **cfg})
    if model_type != "minicpm3":
        return {}
    out = {**RENAMED[model_type][1], **cfg}
    values = {key: out[key] for key in ("scale_emb", "scale_depth", "dim_model_base")}
    for key, value in values.items():
        nullable = key != "scale_emb"  # (MiniCPM3Config fills a null scale_depth / dim_model_base, not scale_emb)
        if (value is None and not nullable) or (
            value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0)
        ):
            raise refuse(key, value, " (a positive number)")
    layers, hidden = out["num_hidden_layers"], out["hidden_size"]
    depth = values["scale_depth"] if values["scale_depth"] is not None else math.sqrt(layers)  # (None: no scaling)
    fields = {
        "embed_multiplier": float(values["scale_emb"]),
        "residual_multiplier": float(depth) / math.sqrt(layers),
        "logits_divisor": hidden / float(values["dim_model_base"] or hidden),
    }
    longrope = _longrope_of(out)
    if longrope is not None:
        head = {**out, "head_dim": out.get("qk_rope_head_dim", 32)}
        max_pos = int(out.get("max_position_embeddings", 32768))
        original = longrope.get("original_max_position_embeddings") or max_pos  # (transformers' fill-in; a
        # top-level original_max_position_embeddings is Phi-3's, not read here)
        fields["rope_scaling"] = longrope_scaling(head, longrope, int(original))
    return fields


def _longrope_of(cfg: dict[str, Any]) -> dict[str, Any] | None:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return rope if (rope.get("rope_type") or rope.get("type")) == "longrope" else None


def _minicpm(cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniCPMConfig's keys as GraniteConfig's: muP's scalars (the remote code applies them whatever else the config
    says), the query scale head_dim ** -0.5, heads hidden_size / heads wide (its code's only width)."""
    if cfg.get("num_experts"):
        raise refuse("num_experts", cfg["num_experts"], " (MiniCPM-MoE's experts)")
    if cfg.get("use_mup", True) is not True:  # (VoxCPM's MiniCPM4 backbone key, unknown to openbmb's code)
        raise refuse("use_mup", cfg["use_mup"], " (openbmb's MiniCPM code always applies its muP scalars)")
    heads, hidden, layers = cfg["num_attention_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
    if hidden % heads:
        raise refuse("num_attention_heads", heads, f" (MiniCPM's heads split hidden_size {hidden} evenly)")
    width = hidden // heads
    for key in ("kv_channels", "head_dim"):  # (VoxCPM's and others' widths: MiniCPM's code reads neither)
        if cfg.get(key) not in (None, width):
            raise refuse(key, cfg[key], f" for minicpm (its attention is hidden_size / heads = {width} wide)")
    for key in ("scale_emb", "scale_depth", "dim_model_base"):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise refuse(key, value, " (a positive number)")
    out = {k: v for k, v in cfg.items() if k not in ("kv_channels", "use_mup", "mlp_bias")}  # (its MLP: no biases)
    return {
        **out,
        "head_dim": width,
        "attention_multiplier": width**-0.5,
        "embedding_multiplier": float(cfg["scale_emb"]),
        "residual_multiplier": cfg["scale_depth"] / math.sqrt(layers),
        "logits_scaling": hidden / cfg["dim_model_base"],
    }


def _minicpm_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM's LongRoPE as its remote code builds it, and InfLLM v2 (sparse_config) served where that code attends
    densely: while a sequence holds fewer than dense_len tokens (`kv_seq_len < dense_len`; default 8192)."""
    fields: dict[str, Any] = {}
    longrope = _longrope_of(cfg)
    if longrope is not None:
        fields["rope_scaling"] = _minicpm_longrope(cfg, longrope)
    sparse = cfg.get("sparse_config")
    if sparse is not None:
        if not isinstance(sparse, dict):
            raise refuse("sparse_config", sparse, " (InfLLM v2's settings: a mapping)")
        dense = sparse.get("dense_len", 8192)
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 2:  # (-1: sparse at every length)
            raise refuse("sparse_config.dense_len", dense, " (InfLLM v2's sparse attention is not implemented)")
        fields["dense_limit"] = dense - 1  # (the longest context served: check_servable)
        logger.info(
            "sparse_config: InfLLM v2 attends densely below dense_len=%d tokens; served within %d", dense, dense - 1
        )
    return fields


def _minicpm_longrope(cfg: dict[str, Any], longrope: dict[str, Any]) -> dict[str, Any]:
    """MiniCPMLongRoPE: cos and sin times sqrt(1 + log(max / original) / log(original)) (whatever factor or
    attention_factor rope_scaling states: the code reads neither), from one table built for max_position_embeddings
    positions, so past the original length the long factors turn every position (the short ones never do)."""
    original = longrope.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 2:
        raise refuse("rope_scaling.original_max_position_embeddings", original, " (MiniCPM's LongRoPE needs it)")
    max_pos = int(cfg["max_position_embeddings"])
    squared = 1 + math.log(max_pos / original) / math.log(original)
    if squared <= 0:
        raise refuse("max_position_embeddings", max_pos, f" below LongRoPE's original length {original}")
    head = {**cfg, "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"]}
    stated = {k: v for k, v in longrope.items() if k not in ("factor", "attention_factor")}
    scaling = longrope_scaling(head, stated, original)
    if max_pos > original:  # (whatever context Lantern serves, the factors of the remote code's table)
        scaling["short_factor"] = scaling["long_factor"]
    return {**scaling, "attention_factor": math.sqrt(squared)}


def _internlm2(cfg: dict[str, Any]) -> dict[str, Any]:
    """InternLM2Config's keys as LlamaConfig's: `bias` (wqkv's and wo's; on unless stated) refused as Llama's
    attention_bias is; heads hidden_size / heads wide; keys LlamaConfig reads that InternLM2's code does not
    (attention_bias, mlp_bias: `bias` is its only one) dropped, as attn_implementation (not maths)."""
    if cfg["bias"]:
        raise refuse("bias", cfg["bias"], " for internlm2 (biases on wqkv and wo: the o_proj bias)")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    if hidden % heads:
        raise refuse("num_attention_heads", heads, f" (InternLM2's heads split hidden_size {hidden} evenly)")
    if cfg.get("head_dim") not in (None, hidden // heads):
        raise refuse("head_dim", cfg["head_dim"], f" for internlm2 (its attention is {hidden // heads} wide)")
    dropped = ("bias", "attention_bias", "mlp_bias", "attn_implementation")
    return {**{k: v for k, v in cfg.items() if k not in dropped}, "head_dim": hidden // heads}


def _bailing(cfg: dict[str, Any]) -> dict[str, Any]:
    """BailingMoeV2's config as GLM-4.5's: its refusals, the rope's width from rotary_dim where stated, and the head
    width mlx_lm computes (hidden / heads; a head_dim that says otherwise is refused)."""
    for key, (wanted, why) in _BAILING_REFUSED.items():
        value = cfg.get(key, wanted if key != "score_function" else "softmax")
        if value != wanted:
            raise refuse(key, value, why)
    heads = cfg["num_attention_heads"]
    width = cfg["hidden_size"] // heads
    if cfg.get("head_dim") not in (None, width):
        raise refuse(
            "head_dim", cfg["head_dim"], f" for bailing_moe (its attention is hidden_size / heads = {width} wide)"
        )
    inner = cfg.get("moe_shared_expert_intermediate_size")
    if inner not in (None, cfg["moe_intermediate_size"]):
        raise refuse("moe_shared_expert_intermediate_size", inner, " (each shared expert as wide as a routed one)")
    out = {**cfg, "head_dim": width}
    if cfg.get("rotary_dim") is not None:
        out["partial_rotary_factor"] = cfg["rotary_dim"] / width
    if out.get("n_group", 1) == 1:
        out["topk_group"] = 1  # (mlx_lm's default 4 means nothing without groups)
    return out


# Ling 1.x keys whose other values are maths Lantern does not compute (mlx_lm's defaults are these)
_LING1_REFUSED = {
    "use_bias": (False, " (biases on o_proj and the MLPs)"),
    "use_qk_norm": (False, " for Ling 1.x (its q/k norms)"),
    "moe_router_enable_expert_bias": (False, " (a softmax router with an expert bias)"),
    "n_group": (1, " for Ling 1.x (expert groups)"),
    "use_sliding_window": (False, " for Ling 1.x (its sliding window)"),
}


def _ling1(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ling 1.x / Ring-lite (BailingMoeForCausalLM: remote code, mlx_lm's bailing_moe reads it) as DeepSeek-MoE's
    config: Llama's attention (q/k/v biases with use_qkv_bias, none on o_proj; a partial rope with rotary_dim) over a
    softmax router, its top-k renormalised with norm_topk_prob and scaled, beside the shared experts; norm_head's
    column-normalised head is extra_fields'."""
    for key, (wanted, why) in _LING1_REFUSED.items():
        if cfg.get(key, wanted) not in (wanted, None if wanted is False else wanted):
            raise refuse(key, cfg[key], why)
    heads = cfg["num_attention_heads"]
    width = cfg["hidden_size"] // heads
    if cfg.get("head_dim") not in (None, width):
        raise refuse("head_dim", cfg["head_dim"], f" for bailing_moe (its attention is hidden / heads = {width} wide)")
    inner = cfg.get("moe_shared_expert_intermediate_size")
    if inner not in (None, cfg["moe_intermediate_size"]):
        raise refuse("moe_shared_expert_intermediate_size", inner, " (each shared expert as wide as a routed one)")
    out = {k: v for k, v in cfg.items() if k not in ("score_function", "n_group", "topk_group", "norm_head")}
    out |= {"model_type": "deepseek", "head_dim": width, "attention_out_bias": False}  # (use_qkv_bias: q/k/v only)
    if cfg.get("rotary_dim") is not None:
        out["partial_rotary_factor"] = cfg["rotary_dim"] / width
    if not cfg.get("moe_router_enable_shared_expert", True):
        out["n_shared_experts"] = 0
    if not cfg.get("moe_router_enable_routed_scaling", True):
        out["routed_scaling_factor"] = 1.0
    return out


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """Ling 1.x's norm_head: the head's columns divided by their L2 norms (+ 1e-7) in float32, as its code and mlx_lm
    compute them, once while loading (a quantized head is taken as its converter normalised it); the rest as is."""
    if not spec.config.norm_head:
        yield from source
        return
    for name, value in source:
        yield name, (_column_normalised(value) if name == "lm_head.weight" else value)


def _column_normalised(w: Any) -> Any:
    """A float head (an MLX array or a torch tensor, as the stream yields them) normalised; a quantized one (its
    wrapper types) as its converter stored it."""
    if type(w).__module__.startswith("mlx"):
        import mlx.core as mx

        f = w.astype(mx.float32)
        return (f / (mx.sqrt((f * f).sum(axis=0, keepdims=True)) + 1e-7)).astype(w.dtype)
    if type(w).__module__.startswith("torch"):
        f = w.float()
        return (f / (f.norm(dim=0, keepdim=True) + 1e-7)).to(w.dtype)
    return w


def _sarvam_mla_legacy(cfg: dict[str, Any]) -> dict[str, Any]:
    """The original Sarvam-105B config.json (written for its remote code): head_dim / q_head_dim are derived
    (dropped, as SarvamMLAConfig drops them), `deepseek_yarn` is plain YaRN."""
    out = {k: v for k, v in cfg.items() if k not in ("head_dim", "q_head_dim")}
    scaling = out.get("rope_scaling") or {}
    if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        del out["rope_scaling"]
        out["rope_parameters"] = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": "yarn"}
    return out


# Sarvam-30B's and Ling 2.0's tensor names (Bailing's) -> GLM-4.5's; query_key_value [q | k | v] rows is split by
# weight_stream.split_fused as qkv_proj
_BAILING_NAMES = (
    (re.compile(r"^model\.word_embeddings\."), "model.embed_tokens."),
    (re.compile(r"\.attention\.query_key_value\."), ".self_attn.qkv_proj."),
    (re.compile(r"\.attention\.dense\."), ".self_attn.o_proj."),
    (re.compile(r"\.attention\.query_layernorm\."), ".self_attn.q_norm."),
    (re.compile(r"\.attention\.key_layernorm\."), ".self_attn.k_norm."),
    (re.compile(r"\.mlp\.gate\.expert_bias$"), ".mlp.gate.e_score_correction_bias"),
    (re.compile(r"\.mlp\.gate\.gate_proj\."), ".mlp.gate."),  # (mlx_lm's bailing_moe moves the router there)
)


def checkpoint_name(name: str) -> str | None:
    """A renamed family's checkpoint tensor name as its family's model files name it; None for MiMo's
    multi-token-prediction layers (never run)."""
    if name.startswith("model.mtp_layers."):
        return None
    for pattern, new in _BAILING_NAMES:
        name = pattern.sub(new, name)
    return name
