"""Meituan LongCat-Flash (model_type "longcat_flash": meituan-longcat/LongCat-Flash-Chat / -Thinking): what its
config.json means, as transformers' LongcatFlashConfig reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_longcat_flash): each of num_layers layers runs two sublayers of DeepSeek-V3's
multi-head latent attention (a q LoRA always; the query times sqrt(hidden / q_lora_rank), the normed latent -- keys
and values alike -- times sqrt(hidden / kv_lora_rank); the rope on interleaved pairs), each followed by its own dense
SwiGLU MLP (ffn_hidden_size), and one mixture beside them: read from the first MLP's input and added to the second
MLP's output (the shortcut). Its router is a float32 softmax over n_routed_experts + zero_expert_num choices whose
pick adds e_score_correction_bias, the picked probabilities (not renormalised) times routed_scaling_factor; a "zero"
expert's output is its input. The KV pool holds 2 x num_layers latent layers (ModelConfig.kv_layers).
"""

from __future__ import annotations

import re
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig, MLAConfig, softmax_scale

# LongcatFlashConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults")
DEFAULTS: dict[str, Any] = {
    "vocab_size": 131072,
    "hidden_size": 6144,
    "num_attention_heads": 64,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "rope_theta": 10000000.0,  # (default_theta)
}
_MLA_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys spec.ModelConfig.from_hf reads, as LongcatFlashConfig names them: its layers (num_layers; a stated
    num_hidden_layers counts the attention sublayers, two per layer), the dense MLPs' width (ffn_hidden_size)."""
    layers = cfg.get("num_layers")
    if layers is None:
        layers = int(cfg.get("num_hidden_layers", 56)) // 2
    return {**cfg, "num_hidden_layers": int(layers), "intermediate_size": int(cfg.get("ffn_hidden_size", 12288))}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a longcat_flash config; refuses, naming the key, what it does not compute."""
    if model_type != "longcat_flash":
        raise refuse("model_type", model_type, " for family_longcat")
    check_silu(cfg, "LongCat-Flash")
    for key in ("attention_bias", "mlp_bias", "router_bias", "norm_topk_prob"):  # (the release: none)
        if cfg.get(key):
            raise refuse(key, cfg[key], " for longcat_flash")
    for key, value in (("attention_method", "MLA"), ("zero_expert_type", "identity")):  # (the release's own keys)
        if cfg.get(key, value) != value:
            raise refuse(key, cfg[key], f" (only {value!r})")
    heads = fields["num_heads"]
    if cfg.get("num_key_value_heads") not in (None, heads):  # (its latent attention expands to every head)
        raise refuse("num_key_value_heads", cfg["num_key_value_heads"], f" (MLA needs num_attention_heads={heads})")
    get = {k: int(cfg.get(k) if cfg.get(k) is not None else v) for k, v in _MLA_DEFAULTS.items()}
    v_head = int(cfg.get("v_head_dim", 128))
    qk_head = get["qk_nope_head_dim"] + get["qk_rope_head_dim"]
    if cfg.get("qk_head_dim") not in (None, qk_head):
        raise refuse("qk_head_dim", cfg["qk_head_dim"], f" (qk_nope_head_dim + qk_rope_head_dim = {qk_head})")
    if cfg.get("head_dim") not in (None, get["qk_rope_head_dim"]):  # (its rope's width: the rope table's)
        raise refuse("head_dim", cfg["head_dim"], f" (its rope turns qk_rope_head_dim = {get['qk_rope_head_dim']})")
    hidden = fields["hidden_size"]
    mla = MLAConfig(
        kv_lora_rank=get["kv_lora_rank"],
        q_lora_rank=get["q_lora_rank"],
        qk_nope_head_dim=get["qk_nope_head_dim"],
        qk_rope_head_dim=get["qk_rope_head_dim"],
        v_head_dim=v_head,
        rope_interleave=True,
        # (the release states mla_scale_q_lora / _kv_lora true; transformers always scales)
        q_scale=(hidden / get["q_lora_rank"]) ** 0.5 if cfg.get("mla_scale_q_lora", True) else 1.0,
        kv_scale=(hidden / get["kv_lora_rank"]) ** 0.5 if cfg.get("mla_scale_kv_lora", True) else 1.0,
    )
    experts, zeros = int(cfg.get("n_routed_experts", 512)), int(cfg.get("zero_expert_num") or 0)
    top_k = int(cfg.get("moe_topk", 12))
    if experts < 1 or not 1 <= top_k <= experts + zeros:
        raise refuse("moe_topk", top_k, f" (must be between 1 and the {experts + zeros} choices)")
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("expert_ffn_hidden_size", 2048)),
        norm_topk_prob=False,
        router_weights_fp32=True,  # (each expert's share scaled in float32)
        scoring="softmax",
        topk_method="noaux_tc",  # (the choice by score + bias; one group)
        correction_bias=True,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 6.0)),
        zero_experts=zeros,
    )
    return {
        "num_kv_heads": 1,
        "head_dim": mla.qk_rope_head_dim,  # (the runners' rope tables)
        "attn_scale": softmax_scale(cfg, qk_head),
        "mla": mla,
        "moe": moe,
        "kv_layers": 2 * fields["num_layers"],
        "mtp_layers": 0,
    }


_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
_NAMES = (
    (".mlp.router.classifier.", ".mlp.gate."),
    (".mlp.router.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
)


def name_map(spec: Any) -> Any:
    """The checkpoint's names as the model files' (the router as DeepSeek's gate); the zero experts' slots, which
    transformers' save writes from its zero-padded stack, and the prediction module are skipped."""
    experts = spec.config.moe.num_experts

    def rename(name: str) -> str | None:
        m = _EXPERT.match(name)
        if ".mtp" in name or name.startswith("model.mtp") or (m and int(m.group(1)) >= experts):
            return None
        for old, new in _NAMES:
            name = name.replace(old, new)
        return name

    return rename
