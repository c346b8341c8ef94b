"""Ling 3.0 (inclusionAI's Ling-3.0-Flash and kin; model_type "bailing_hybrid"), as transformers' BailingHybridConfig
reads its config.json -- the released keys (num_experts, num_experts_per_token, num_shared_experts, moe_renormalize,
num_expert_group, model_max_length) included -- turned into ModelConfig fields for Kimi Linear's model files.

The maths (transformers' modeling_bailing_hybrid): Kimi Linear's layer (family_kimi_linear) -- Kimi Delta Attention in
most layers, latent attention in every layer_group_size-th, DeepSeek-V3's mixture after the first dense layers --
with three differences:
- KDA's forget-gate and output-gate inputs are full-rank (f_proj, g_proj: hidden -> heads x d_k), and with
  kda_safe_gate (the default) the log-decay is bounded: g = kda_lower_bound x sigmoid(exp(A_log) (f_proj(x) +
  dt_bias)) instead of -exp(A_log) softplus(...) (KdaConfig.full_rank / gate_bound);
- the latent attention rotates its rope part (interleaved pairs, rope_theta) and gates each head's output by
  sigmoid(g_proj(x)) before o_proj (MLAConfig.head_gate);
- scores scaled by qk_head_dim ** -0.5 as DeepSeek-V3's (no YaRN mscale: other rope types are refused).

Ling 2.5 (remote code under the same model type, mlx_lm's bailing_hybrid: lightning attention with group norms) is
refused by its group_norm_size.

Checkpoints: transformers' layout (self_attn.forget_gate.{f_proj, A_log, dt_bias}, one conv1d) and inclusionAI's
released one, read as transformers' conversion mapping reads it: word_embeddings, attention.* as self_attn.*, dense
as o_proj, q/k/v_conv1d joined into conv1d, the router's expert_bias as e_score_correction_bias, one expert's
gate / up / down_proj at a time; multi-token-prediction layers (past num_hidden_layers) skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

_ALIASES = ("max_position_embeddings", "norm_topk_prob", "n_group", "num_local_experts", "n_shared_experts")


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as BailingHybridConfig reads it (its aliases and layer schedules resolved), for from_hf."""
    try:
        from transformers import BailingHybridConfig
    except ImportError:  # (its config class is what reads the released keys and schedules)
        raise UnsupportedModelError(
            "bailing_hybrid (Ling 3.0) is read by transformers' BailingHybridConfig, which this transformers lacks "
            "(5.24 has it): pip install -U transformers"
        ) from None
    if "group_norm_size" in cfg:  # (Ling 2.5's remote code shares the model type: mlx_lm's bailing_hybrid reads it)
        raise refuse(
            "group_norm_size", cfg["group_norm_size"], " (Ling 2.5's lightning-attention layers: only Ling 3.0's KDA)"
        )
    skip = ("model_type", "transformers_version", "architectures", "auto_map")
    try:
        built = BailingHybridConfig(**{k: v for k, v in cfg.items() if k not in skip})
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"bailing_hybrid config.json: transformers cannot read it ({exc})") from None
    out = {k: v for k, v in built.to_dict().items() if k not in ("architectures", "transformers_version")}
    for name in _ALIASES:
        out[name] = getattr(built, name)  # (attribute_map aliases: to_dict writes the released names)
    out["num_experts_per_tok"] = built.num_experts_per_tok
    out["linear_num_heads"], out["linear_head_dim"] = built.linear_num_heads, built.linear_head_dim
    out["linear_conv_kernel_dim"] = built.linear_conv_kernel_dim
    rope = dict(built.rope_parameters or {})
    if rope.get("rope_type", "default") != "default":
        raise refuse("rope_parameters", rope, " (the latent attention's plain rope only)")
    out["rope_theta"] = float(rope.get("rope_theta", built.rope_theta))
    out.pop("rope_parameters", None)
    out.pop("rope_scaling", None)
    return {**out, "model_type": "bailing_hybrid"}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a (prepared) bailing_hybrid config: Kimi Linear's, with Ling 3.0's gates."""
    from dataclasses import replace

    from lantern.app.models import family_kimi_linear

    if model_type != "bailing_hybrid":
        raise UnsupportedModelError(f"family_bailing_hybrid does not configure model_type {model_type!r}")
    out = family_kimi_linear.configure("kimi_linear", cfg, fields)
    kda, mla = out["linear_attn"], out["mla"]
    bound = float(cfg["kda_lower_bound"]) if cfg.get("kda_safe_gate", True) else None
    if bound is not None and bound >= 0:
        raise refuse("kda_lower_bound", bound, " (a log-decay bound: must be negative)")
    out["linear_attn"] = replace(kda, full_rank=True, gate_bound=bound)
    out["mla"] = replace(mla, rope=True, rope_interleave=True, head_gate=True, norm_eps=1e-6)
    return out


def name_map(spec: Any) -> Callable[[str], str | None]:
    """checkpoint_name with the model's layer count (its multi-token-prediction layers come after)."""
    layers = spec.config.num_layers
    return lambda name: checkpoint_name(name, layers)


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_RELEASED = (
    (re.compile(r"^model\.word_embeddings\."), "model.embed_tokens."),
    (re.compile(r"\.attention\."), ".self_attn."),
    (re.compile(r"\.self_attn\.forget_gate\."), ".self_attn."),
    (re.compile(r"\.self_attn\.dense\."), ".self_attn.o_proj."),
    (re.compile(r"\.mlp\.gate\.expert_bias$"), ".mlp.gate.e_score_correction_bias"),
)


def checkpoint_name(name: str, layers: int | None = None) -> str | None:
    """A Ling 3.0 checkpoint's tensor under Kimi Linear's model files' names (None: a multi-token-prediction layer);
    unknown names kept for the loader to refuse."""
    m = _LAYER.match(name)
    if m is not None and layers is not None and int(m.group(1)) >= layers:
        return None
    for pattern, new in _RELEASED:
        name = pattern.sub(new, name)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """KDA's A_log and dt_bias flat ([H], [H x d_k]), each layer's q, k and v convolutions joined into conv1d."""
    from lantern.app.models.family_qwen3_next import join_qkv_convs

    def flat() -> Iterator[tuple[str, Any]]:
        for name, value in source:
            if name.endswith((".self_attn.A_log", ".self_attn.dt_bias")):
                value = value.reshape(-1)
            yield name, value

    return join_qkv_convs(flat(), "self_attn", "bailing_hybrid")
