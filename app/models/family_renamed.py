"""Architectures whose maths is another family's, stated in config.json under other key names and defaults
(transformers' own classes for them are that family's model on a config subclass):

- InternLM3 (`internlm3`): Llama; `qkv_bias` / `bias` are attention_bias / mlp_bias (both refused, as Llama's).
- IQuest-Coder (`iquestcoder`): Llama; the original code's clip_qkv and sliding window are refused, as
  IQuestCoderConfig refuses them.
- Sarvam-30B (`sarvam_moe`): GLM-4.5's attention and mixture with the rope over the whole head, q/k norms on.
- Sarvam-105B (`sarvam_mla`): DeepSeek-V3 (MLA, one expert group); the original config's `deepseek_yarn` is YaRN.
- Youtu-LLM (`youtu`): DeepSeek-V3's latent attention over a dense SwiGLU MLP in every layer.

spec.ModelConfig.from_hf renames the keys (`same_as`), fills the config class's defaults where they differ from
the family's, then reads the config as the family's model_type; the ModelConfig keeps the original name.
"""

from __future__ import annotations

import re
from typing import Any

from lantern.app.models.errors import refuse

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

# YoutuConfig deletes DeepseekV3Config's mixture keys: whatever a config.json says of them, every layer is dense.
_YOUTU_DROPPED = (
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
    if model_type == "iquestcoder":
        for key in ("clip_qkv", "use_sliding_window"):
            if out.get(key):
                raise refuse(key, out[key], " for iquestcoder (IQuestCoderConfig refuses it too)")
    if model_type == "sarvam_mla":
        out = _sarvam_mla_legacy(out)
    if model_type == "youtu":
        out = {k: v for k, v in out.items() if k not in _YOUTU_DROPPED}
        out["n_routed_experts"], out["num_nextn_predict_layers"] = 0, 0
    return {**out, "model_type": family}


def _sarvam_mla_legacy(cfg: dict[str, Any]) -> dict[str, Any]:
    """The original Sarvam-105B config.json (written for its remote code): head_dim / q_head_dim are derived
    (dropped, as SarvamMLAConfig drops them), `deepseek_yarn` is plain YaRN."""
    out = {k: v for k, v in cfg.items() if k not in ("head_dim", "q_head_dim")}
    scaling = out.get("rope_scaling") or {}
    if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        del out["rope_scaling"]
        out["rope_parameters"] = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": "yarn"}
    return out


# Sarvam-30B's released tensor names (Bailing's) -> GLM-4.5's; query_key_value [q | k | v] rows is split by
# weight_stream.split_fused as qkv_proj
_SARVAM_MOE_NAMES = (
    (re.compile(r"^model\.word_embeddings\."), "model.embed_tokens."),
    (re.compile(r"\.attention\.query_key_value\."), ".self_attn.qkv_proj."),
    (re.compile(r"\.attention\.dense\."), ".self_attn.o_proj."),
    (re.compile(r"\.attention\.query_layernorm\."), ".self_attn.q_norm."),
    (re.compile(r"\.attention\.key_layernorm\."), ".self_attn.k_norm."),
    (re.compile(r"\.mlp\.gate\.expert_bias$"), ".mlp.gate.e_score_correction_bias"),
)


def checkpoint_name(name: str) -> str:
    """A renamed family's checkpoint tensor name as its family's model files name it."""
    for pattern, new in _SARVAM_MOE_NAMES:
        name = pattern.sub(new, name)
    return name
