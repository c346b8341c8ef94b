"""Rope scaling as both backends implement it: a config's rope_scaling / rope_parameters normalized
(or refused naming the key), and LongRoPE's choice of factors."""

from __future__ import annotations

import math
from typing import Any

from lantern.app.models.errors import refuse as _refuse

# Keys each rope type may carry; both backends compute exactly these (torch through transformers'
# initialisers, MLX through backends/mlx/rope.py). Anything else changes the maths in a way one of
# them ignores. YaRN's attention factor is the config's explicit attention_factor, else derived from
# mscale / mscale_all_dim (DeepSeek V2/V3), else from factor (transformers' _compute_yarn_parameters).
_ROPE_KEYS = {
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
    },
    "dynamic": {"factor", "original_max_position_embeddings"},
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"},
}


# The model types whose transformers code and Lantern's attention both rotate the first part of each head
_PARTIAL_ROPE_FAMILIES = (
    "glm",
    "glm4",
    "glm4_moe",
    "phi3",
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "minimax_m2",
    "bamba",
    "phi",
    "stablelm",
    "nemotron",
    "gpt_neox",
    "gptj",
    "codegen",
    "laguna",
    "step3p5",
    "deepseek",  # (Ling 1.x's partial rope: family_renamed reads it as DeepSeek-MoE's layer)
    "mimo_v2_flash",
    "recurrent_gemma",
)


def with_default_partial(cfg: dict[str, Any], scaling: dict[str, Any] | None, default: float) -> dict[str, Any] | None:
    """`scaling` (rope_scaling's result) with a config class's default partial_rotary_factor where config.json
    states none (PhiConfig / StableLmConfig / NemotronConfig: "assign default for BC"); a stated factor, 1.0
    included (rope_scaling drops a 1.0: the whole head turns), is kept."""
    stated = cfg.get("partial_rotary_factor", (cfg.get("rope_parameters") or {}).get("partial_rotary_factor"))
    if stated is not None:
        return scaling
    return {**(scaling or {"rope_type": "default"}), "partial_rotary_factor": default}


def rope_scaling(cfg: dict[str, Any], rope: dict[str, Any], max_pos: int) -> dict[str, Any] | None:
    """The rope scaling both backends implement, normalized; refuses the rest naming the key.

    A partial rotary factor (rope on the first int(head_dim * factor) dims of each head) is kept
    in the result as "partial_rotary_factor", where transformers 5 keeps it too (rope_parameters);
    only _PARTIAL_ROPE_FAMILIES take it: GLM-4 (interleaved pairs), the others rotate_half."""
    scaling = dict(cfg.get("rope_scaling") or rope)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    model_type = cfg.get("model_type")
    if model_type == "phi3" and rope_type in ("su", "yarn"):
        rope_type = "longrope"  # Phi3Config reads its older configs' names so
    elif rope_type == "longrope" and model_type not in ("phi3", "phimoe", "granite"):
        # Phi-3 / Phi-4-mini checkpoints carry it, and MiniCPM 4 GGUFs (read as Granite: gguf_llama_builders); Phi-3's
        # transformers code recomputes the cache when a sequence switches factors, the rule longrope_factors follows,
        # and transformers 5's shared rope update picks the factors the same way for Granite.
        raise _refuse("rope_scaling.rope_type", rope_type, f" for {model_type or 'this family'} (Phi-3 and MiniCPM)")
    partial = scaling.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor")
    partial = None if partial in (None, 1, 1.0) else float(partial)
    if partial is not None:
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads if heads else 0)
        if model_type not in _PARTIAL_ROPE_FAMILIES or not 0 < partial < 1 or int(head_dim * partial) % 2:
            raise _refuse("partial_rotary_factor", partial, " (rotary embedding on part of each head)")
    plain = None if partial is None else {"rope_type": "default", "partial_rotary_factor": partial}
    if rope_type == "default":
        return plain
    if rope_type == "telechat3-yarn":
        rope_type, scaling = "yarn", _telechat3_yarn(scaling)
    if rope_type not in _ROPE_KEYS:
        raise _refuse("rope_scaling.rope_type", rope_type, f"; supported: default, {', '.join(sorted(_ROPE_KEYS))}")
    # truncate true: transformers' default (and mlx_lm's). False, an untruncated YaRN range (gpt-oss; any
    # family): both backends compute it (transformers' initialiser, rope.py). Gemma 3 alone comes here
    # without a model_type, and its transformers code never reads the key there.
    untruncated = rope_type == "yarn" and scaling.get("truncate") is False
    if untruncated and not model_type:
        raise _refuse("rope_parameters.full_attention.truncate", False, " for Gemma 3 (transformers ignores it)")
    if untruncated or scaling.get("truncate") is True:
        scaling.pop("truncate")
    extra = sorted(k for k, v in scaling.items() if k not in _ROPE_KEYS[rope_type] and v is not None)
    if extra:
        raise _refuse(f"rope_scaling.{extra[0]}", scaling[extra[0]], f" for rope_type {rope_type}")
    if rope_type == "longrope":
        return _longrope(cfg, scaling, partial)
    if rope_type == "dynamic":
        # Dynamic NTK rescales only once a sequence outgrows max_position_embeddings; below that it
        # is plain rope. max_context stays max_position_embeddings, so plain rope is the exact maths.
        return plain
    if scaling.get("factor") is None:
        raise _refuse("rope_scaling.factor", None, f" (rope_type {rope_type} needs a factor)")
    if rope_type in ("yarn", "llama3") and scaling.get("original_max_position_embeddings") is None:
        # transformers' default; mlx_lm would otherwise assume 4096 (YaRN) or 8192 (llama3).
        scaling["original_max_position_embeddings"] = max_pos
    attention = scaling.get("attention_factor")
    if attention is not None:
        # transformers only warns and multiplies cos/sin by it: 0 or less would zero or flip the rope.
        if isinstance(attention, bool) or not isinstance(attention, (int, float)) or attention <= 0:
            raise _refuse("rope_scaling.attention_factor", attention, " (must be a positive number)")
        scaling["attention_factor"] = float(attention)
    scaling["rope_type"] = rope_type
    if untruncated:
        scaling["truncate"] = False
    if partial is not None:
        scaling["partial_rotary_factor"] = partial
    return {k: v for k, v in scaling.items() if v is not None}


def _telechat3_yarn(scaling: dict[str, Any]) -> dict[str, Any]:
    """TeleChat3's YaRN (rope_type "telechat3-yarn"): YaRN's frequencies, its attention factor 0.07 ln(factor) + 1
    instead of YaRN's 0.1 ln(factor) + 1 (vLLM's TeleChat3RoPEScaledRotaryEmbedding; mlx_lm computes plain YaRN)."""
    for key in ("attention_factor", "mscale", "mscale_all_dim"):  # (its code's factor reads none of them)
        if scaling.get(key) is not None:
            raise _refuse(f"rope_scaling.{key}", scaling[key], " for rope_type telechat3-yarn")
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise _refuse("rope_scaling.factor", factor, " (rope_type telechat3-yarn needs a positive factor)")
    if scaling.get("original_max_position_embeddings") is None:  # (vLLM derives it; the released configs state it)
        raise _refuse("rope_scaling.original_max_position_embeddings", None, " for rope_type telechat3-yarn")
    return {**scaling, "attention_factor": 0.07 * math.log(factor) + 1.0 if factor > 1 else 1.0}


def _longrope(
    cfg: dict[str, Any], scaling: dict[str, Any], partial: float | None, original: int | None = None
) -> dict[str, Any]:
    """Phi-3's LongRoPE as Phi3Config reads it: one short and one long factor per rotated pair; the
    top-level original_max_position_embeddings (default 4096) wins over one inside rope_scaling.
    original: the pretraining length another family states (MiniCPM3: rope_scaling's own)."""
    heads = cfg["num_attention_heads"]
    pairs = int((cfg.get("head_dim") or cfg["hidden_size"] // heads) * (partial or 1.0)) // 2
    out: dict[str, Any] = {"rope_type": "longrope"}
    for key in ("short_factor", "long_factor"):
        f = scaling.get(key)
        if not isinstance(f, list) or len(f) != pairs or not all(isinstance(v, (int, float)) and v > 0 for v in f):
            shown = f"{len(f)} numbers" if isinstance(f, list) else f
            raise _refuse(f"rope_scaling.{key}", shown, f" (LongRoPE takes {pairs} positive numbers, one per pair)")
        out[key] = [float(v) for v in f]
    for key in ("factor", "attention_factor"):
        v = scaling.get(key)
        if v is not None and not (isinstance(v, (int, float)) and v > 0):
            raise _refuse(f"rope_scaling.{key}", v, " (must be a positive number)")
        if v is not None:
            out[key] = float(v)
    out["original_max_position_embeddings"] = int(original or cfg.get("original_max_position_embeddings", 4096))
    if partial is not None:
        out["partial_rotary_factor"] = partial
    return out


def longrope_factors(scaling: dict[str, Any], max_position_embeddings: int) -> str:
    """Which LongRoPE factors ("long_factor" or "short_factor") every position of every sequence uses.

    transformers picks them per forward pass: the short ones while a sequence has at most
    original_max_position_embeddings tokens, the long ones past that (Phi-3's generate() then drops
    its cache and recomputes the whole sequence with them). A paged cache cannot re-rotate keys it
    holds (prefix blocks are shared), so Lantern picks once per model, as vLLM does: the long ones
    when the model's context goes past the original length. Every logit of a sequence longer than
    that equals transformers' forward over it; so does every logit when the context stays within
    it. Shorter sequences under a longer context differ (check_servable logs it)."""
    # "served_context": --max-model-len, when the user caps the context (ModelConfig.serve_context).
    context = min(max_position_embeddings, scaling.get("served_context") or max_position_embeddings)
    long = context > scaling["original_max_position_embeddings"]
    return "long_factor" if long else "short_factor"


def longrope_scaling(cfg: dict[str, Any], scaling: dict[str, Any], original: int) -> dict[str, Any]:
    """LongRoPE for a family other than Phi-3 whose transformers code picks the factors as Phi-3's does (transformers
    5's shared rope update: the long ones past `original` positions): cfg's head_dim is the rope's width."""
    return _longrope(
        cfg, {k: v for k, v in scaling.items() if k not in ("type", "rope_type", "rope_theta")}, None, original
    )
