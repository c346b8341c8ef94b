"""Poolside Laguna (model_type "laguna": poolside/laguna-XS.2): what its config.json means, as transformers'
LagunaConfig reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_laguna): Llama's pre-norm layer whose attention has per-head q/k RMSNorms before
the rope, a number of query heads of its own per layer (num_attention_heads_per_layer, one KV head count) and its
output times softplus(g_proj(x)) -- one gate per head, or per channel with gating "per-element" -- before o_proj;
layers of two types (layer_types), sliding ones attending within sliding_window, each type with its own rope
(rope_parameters nested by type: the full layers' base 500000 turning half of each head, possibly scaled; the
sliding layers' plain 10000 turning all of it); mlp_layer_types' dense layers a plain MLP, the sparse ones a
sigmoid router (its logits optionally tanh-capped) choosing by score + e_score_correction_bias, the chosen scores
renormalised (no epsilon), the routed output times moe_routed_scaling_factor, a shared expert beside it.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.family_moe import mlp_kinds
from lantern.app.models.family_olmo import layer_type_rope, typed_windows
from lantern.app.models.spec import UnsupportedModelError

# LagunaConfig's rope_parameters when config.json states none: the full layers turn half of each head
_DEFAULT_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
}
_GATES = {True: "softplus_head", "per-head": "softplus_head", "per-element": "softplus"}

# LagunaConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 100352,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 40,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a laguna config; refuses, naming the key, what it does not compute."""
    if model_type != "laguna":
        raise UnsupportedModelError(f"family_laguna does not configure model_type {model_type!r}")
    check_silu(cfg, "Laguna")
    for key in ("attention_bias", "qkv_bias", "moe_apply_router_weight_on_input"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for laguna")
    # Keys mlx_lm or llama.cpp read with other maths (transformers reads none of them): refused when they would
    # differ, so that no loader computes another model from the same folder.
    for key, value in (("moe_router_score_func", "sigmoid"), ("gating_types", None), ("partial_rotary_factor", None)):
        if cfg.get(key, value) != value:
            raise refuse(key, cfg[key], f" for laguna (transformers: {key}={value!r})")
    gating = cfg.get("gating", True)
    if not isinstance(gating, (bool, str)) or gating not in _GATES:  # (false: transformers gates per channel, mlx_lm
        # not at all -- ambiguous, so _GATES has no entry for it)
        raise refuse("gating", gating, " (true / 'per-head' or 'per-element')")
    layers, kv, head_dim = fields["num_layers"], fields["num_kv_heads"], fields["head_dim"]
    heads = list(cfg.get("num_attention_heads_per_layer") or [fields["num_heads"]] * layers)
    if len(heads) != layers or any(not isinstance(h, int) or h < 1 or h % kv for h in heads):
        raise refuse("num_attention_heads_per_layer", heads, f" (a multiple of the {kv} KV heads for each layer)")
    windows = typed_windows(cfg, layers, ["full_attention"] * layers, 512)
    cfg = {**cfg, "rope_parameters": cfg.get("rope_parameters") or _DEFAULT_ROPE}
    rope = typed_ropes(cfg, head_dim, windows, (500000.0, 10000.0), "laguna")
    return {
        "qk_norm": True,
        "attn_output_gate": _GATES[gating],
        "layer_heads": tuple(heads) if len(set(heads)) > 1 else None,
        "num_heads": heads[0] if len(set(heads)) == 1 else fields["num_heads"],
        "layer_windows": windows,
        "moe": _experts(cfg, layers),
        **rope,
    }


def typed_ropes(
    cfg: dict[str, Any], head_dim: int, windows: list[int | None] | None, thetas: tuple[float, float], model_type: str
) -> dict[str, Any]:
    """The rope fields of a config whose rope_parameters nest by layer type with a partial rotary factor each
    (Laguna, MiMo-V2-Flash): the full layers' rope (and scaling), the sliding layers' base and the dims they turn;
    one rope where no layer slides. thetas: the config class's (full, sliding) default bases."""
    max_pos = int(cfg.get("max_position_embeddings", 131072))
    rope = layer_type_rope(cfg, max_pos, thetas[0], thetas[1], model_type=model_type, legacy=False)
    local = cfg["rope_parameters"].get("sliding_attention") or {}
    local_dim = int(head_dim * float(local.get("partial_rotary_factor", 1.0)))
    if not 0 < local_dim <= head_dim or local_dim % 2:
        raise refuse("rope_parameters.sliding_attention.partial_rotary_factor", local["partial_rotary_factor"])
    if windows is None:
        rope["local_rope_theta"] = None  # no sliding layer: one rope
    return {**rope, "local_rope_dim": None if windows is None else local_dim}


def _experts(cfg: dict[str, Any], layers: int) -> DeepSeekMoEConfig | None:
    kinds = mlp_kinds(cfg, layers, ["dense"] + ["sparse"] * (layers - 1))
    experts = int(cfg.get("num_experts", 256) or 0)
    if experts == 0 or "sparse" not in kinds:
        return None
    top_k = int(cfg.get("num_experts_per_tok", 8))
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 512)),
        norm_topk_prob=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        routed_scaling_factor=float(cfg.get("moe_routed_scaling_factor", 1.0)),
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        correction_bias=True,
        shared_size=int(cfg.get("shared_expert_intermediate_size", 512) or 0),
        norm_eps=0.0,
        # (router weight and bias in float32, as llama.cpp and mlx_lm hold them; transformers' bfloat16 model rounds
        # them to bfloat16, so its bfloat16 choices may differ near ties)
        logit_softcap=float(cfg.get("moe_router_logit_softcapping", 0.0) or 0.0),
    )


# checkpoint name -> the model files' (the attention's gate, the router, its bias and shared expert as DeepSeek's)
_NAMES = {
    ".mlp.gate.proj.": ".mlp.gate.",  # (mlx_lm-made folders: the router under gate.proj, its bias as ours)
    ".self_attn.g_proj.": ".self_attn.gate_proj.",
    ".mlp.experts.e_score_correction_bias": ".mlp.gate.e_score_correction_bias",
    ".mlp.shared_expert.": ".mlp.shared_experts.",
}


def checkpoint_name(name: str) -> str:
    """A Laguna tensor under the model files' names."""
    for old, new in _NAMES.items():
        name = name.replace(old, new)
    return name
