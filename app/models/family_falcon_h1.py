"""Falcon-H1 / Falcon-H1R / Falcon-H1-Tiny (TII; model_type falcon_h1): what its config.json means, as
transformers' FalconH1Config reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_falcon_h1): every layer runs a Mamba-2 mixer (family_mamba2, its width
mamba_d_ssm) and Llama's attention side by side on the same normed input and adds both to the residual, then
a SwiGLU MLP:

    h = RMSNorm(x);  x = x + mixer(h) * ssm_out + attn(h * attention_in) * attention_out
    x = x + down(silu(gate(RMSNorm(x)) * mlp_gate) * up(...)) * mlp_down

with μP multipliers in the config: the keys times key_multiplier (a factor of the query scale here: the rope
is linear), in_proj's output parts z / x / B / C / dt times ssm_multipliers (all times ssm_in_multiplier:
Mamba2Config.in_multipliers), the embeddings times embedding_multiplier and the logits times
lm_head_multiplier. The mixer's output is gated by silu(z), normed (mamba_rms_norm) after the gate or, with
mamba_norm_before_gate, before it.

Converted copies hold the multipliers folded into their weights. llama.cpp's converter folds every one
(the GGUF builder states none: its tied files' output is the scaled embedding, as llama.cpp computes it);
mlx_lm's sanitize folds the embedding's, the head's, attention_in into q and k (not v), attention_out,
ssm_out, the MLP's and in_proj's, and not key_multiplier (its rule names a `key_proj` no checkpoint has; mlx_lm
then computes without it). `folded_by_mlx_lm` rewrites such a folder's config to the original model on those
weights: key_multiplier kept, attention_in moved to the output (v lacks it; v enters the output linearly),
the rest 1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lantern.app.models.errors import check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_mamba2 import mixer_config
from lantern.app.models.spec import UnsupportedModelError

logger = logging.getLogger(__name__)

# FalconH1Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "mamba_d_ssm": 1024,  # (an explicit null: mamba_expand x hidden_size)
}


@dataclass(frozen=True)
class FalconH1Scalars:
    """The per-layer multipliers the model files apply (the query's and in_proj's live elsewhere)."""

    attention_in: float  # the attention's input
    attention_out: float  # its output
    ssm_out: float  # the mixer's output
    mlp_gate: float  # the MLP's gate projection, inside the SiLU
    mlp_down: float  # the MLP's output


def _number(cfg: dict[str, Any], key: str) -> float:
    value = cfg.get(key, 1.0)
    value = 1.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(key, value, " (a number)")
    return float(value)


def _numbers(cfg: dict[str, Any], key: str, count: int) -> tuple[float, ...]:
    values = cfg.get(key)
    if values is None:
        return (1.0,) * count
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise _refuse(key, values, f" ({count} numbers)")
    return tuple(_number({key: v}, key) for v in values)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a falcon_h1 config; refuses, naming the key, what it does not compute."""
    if model_type != "falcon_h1":
        raise UnsupportedModelError(f"family_falcon_h1 does not configure model_type {model_type!r}")
    check_silu(cfg, "Falcon-H1")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):  # (LlamaAttention's would bias o_proj too)
            raise _refuse(key, cfg[key], " for Falcon-H1 (biases on the projections)")
    if bool(cfg.get("mamba_proj_bias", False)) != bool(cfg.get("projectors_bias", False)):
        raise _refuse("projectors_bias", cfg.get("projectors_bias"), " (only equal to mamba_proj_bias)")
    if cfg.get("mamba_use_mlp") is False:
        raise _refuse("mamba_use_mlp", False, " (every Falcon-H1 layer has its MLP)")
    gated = bool(cfg.get("mamba_rms_norm", False))
    norm = ("before_gate" if cfg.get("mamba_norm_before_gate", True) else "gated") if gated else "none"
    ssm_in = _number(cfg, "ssm_in_multiplier")
    if cfg.get("mamba_proj_bias") and ssm_in != 1.0:  # (transformers scales in_proj's input: its bias is not scaled)
        raise _refuse("mamba_proj_bias", True, f" with ssm_in_multiplier={ssm_in} (the models scale in_proj's output)")
    mamba = mixer_config(
        cfg,
        fields["hidden_size"],
        (True,) * fields["num_layers"],
        parallel=True,
        norm=norm,
        in_multipliers=tuple(ssm_in * m for m in _numbers(cfg, "ssm_multipliers", 5)),
    )
    gate, down = _numbers(cfg, "mlp_multipliers", 2)
    lm_head = _number(cfg, "lm_head_multiplier")
    if lm_head == 0:
        raise _refuse("lm_head_multiplier", lm_head, " (a number other than 0)")
    return {
        "mamba": mamba,
        "falcon_h1": FalconH1Scalars(
            attention_in=_number(cfg, "attention_in_multiplier"),
            attention_out=_number(cfg, "attention_out_multiplier"),
            ssm_out=_number(cfg, "ssm_out_multiplier"),
            mlp_gate=gate,
            mlp_down=down,
        ),
        "attn_scale": fields["head_dim"] ** -0.5 * _number(cfg, "key_multiplier"),
        "embed_multiplier": _number(cfg, "embedding_multiplier"),
        "logits_divisor": 1.0 / lm_head,
    }


def folded_by_mlx_lm(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    """config.json of a Falcon-H1 folder as its weights mean it. For one mlx_lm converted (its convolution kernels
    in MLX's [C, K, 1] layout) the multipliers its sanitize folded in become 1, but for attention_in, which q and k
    hold and v does not: the model's output then takes it (attention_out's place: o_proj holds attention_out);
    key_multiplier stays (mlx_lm folds none); a tied head's logits take lm_head_multiplier / embedding_multiplier
    (the embedding holds the latter). Other folders are returned as they are."""
    from lantern.app.models.family_qwen3_next import stored_by_mlx_lm

    if cfg.get("model_type") != "falcon_h1" or not stored_by_mlx_lm(sorted(folder.glob("*.safetensors"))):
        return cfg
    if cfg.get("mamba_rms_norm") and int(cfg.get("mamba_n_groups", 1)) != 1:
        raise _refuse("mamba_n_groups", cfg["mamba_n_groups"], " in an mlx_lm folder (mlx_lm norms the whole width)")
    lm_head = _number(cfg, "lm_head_multiplier") / _number(cfg, "embedding_multiplier")
    logger.info("%s: an mlx_lm conversion (Falcon-H1's multipliers folded into its weights)", folder)
    return {
        **cfg,
        **dict.fromkeys(("ssm_in_multiplier", "ssm_out_multiplier", "embedding_multiplier"), 1.0),
        "attention_in_multiplier": 1.0,
        "attention_out_multiplier": _number(cfg, "attention_in_multiplier"),
        "mlp_multipliers": [1.0, 1.0],
        "ssm_multipliers": [1.0] * 5,
        "lm_head_multiplier": lm_head if cfg.get("tie_word_embeddings") else 1.0,
    }


_NAMES = {".feed_forward.": ".mlp.", ".pre_ff_layernorm.": ".post_attention_layernorm."}


def checkpoint_name(name: str) -> str:
    """A Falcon-H1 checkpoint's tensor name in the model files' terms (their MLP, its norm, the final norm)."""
    if name.startswith("model.final_layernorm."):
        return "model.norm." + name.removeprefix("model.final_layernorm.")
    for old, new in _NAMES.items():
        name = name.replace(old, new)
    return name
