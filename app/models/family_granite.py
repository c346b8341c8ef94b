"""Granite 3.x (model_type "granite": ibm-granite/granite-3.*-instruct; "granitemoe": granite-3.*-1b-a400m /
3b-a800m): what its config.json means, as transformers' GraniteConfig / GraniteMoeConfig read it, turned
into ModelConfig fields.

The maths (transformers' modeling_granite): Llama's decoder with four scalars — embeddings times
embedding_multiplier, the query scale attention_multiplier (in place of head_dim ** -0.5), each
sublayer's output times residual_multiplier before it joins the residual stream, and the logits
divided by logits_scaling. Its attention_bias would add an o_proj bias too (refused: the released
models have none), mlp_bias MLP biases. llama.cpp's granite GGUF keys hold the same four numbers
(attention.scale, embedding_scale, residual_scale, logit_scale: a divisor there too).

GraniteMoE: the same scalars over Mixtral's experts (each intermediate_size wide) chosen by a router
whose weights are a softmax over the top-k logits; its checkpoints store each layer's experts fused
(`block_sparse_moe.input_linear` [E, 2I, H], gate rows first; `output_linear` [E, H, I]) and the router
as `block_sparse_moe.router.layer` (granitemoe_name gives them the names the models load).

Granite 4.0-H ("granitemoehybrid": granite-4.0-h-micro / tiny / small): the same scalars over a hybrid
of Mamba-2 mixer layers (family_mamba2) and attention layers, rope only when position_embedding_type
is "rope" (the released models use none). Every layer's MLP is a dense `shared_mlp` (SwiGLU,
shared_intermediate_size wide, gate rows first in `input_linear`), plus GraniteMoE's routed experts
beside it when num_local_experts > 0 (tiny, small). The dense MLP is the model's MLP (intermediate_size
becomes shared_intermediate_size) and the experts keep their own width in moe.intermediate_size.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_moe import MoEConfig


def _scalar(cfg: dict[str, Any], key: str) -> float:
    value = cfg.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _refuse(key, value, " (a positive number)")
    return float(value)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a granite config.json (spec.ModelConfig.from_hf skips its
    Llama-family checks for configure families: the keys are checked here)."""
    if model_type not in ("granite", "granitemoe", "granitemoehybrid"):
        raise UnsupportedModelError(f"family_granite does not configure model_type {model_type!r}")
    if model_type == "granitemoehybrid":
        return _hybrid(cfg, fields)
    check_silu(cfg, "Granite")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " for granite (biases on the projections)")
    return {**_scalars(cfg), **({"moe": _moe(cfg)} if model_type == "granitemoe" else {})}


def _scalars(cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite's four scalars (and what every Granite shares) as ModelConfig fields."""
    return {
        "attn_scale": _scalar(cfg, "attention_multiplier"),
        "embed_multiplier": _scalar(cfg, "embedding_multiplier"),
        "residual_multiplier": _scalar(cfg, "residual_multiplier"),
        "logits_divisor": _scalar(cfg, "logits_scaling"),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
        "hidden_act": "silu",
    }


def _hybrid(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    from lantern.app.models.family_mamba2 import granite_mamba

    check_silu(cfg, "Granite")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " for granite (biases on the projections)")
    rope = cfg.get("position_embedding_type")
    if rope not in (None, "rope", "nope"):
        raise _refuse("position_embedding_type", rope, " (rope or none)")
    layers, experts = fields["num_layers"], int(cfg.get("num_local_experts", 8) or 0)
    mamba = granite_mamba(cfg, layers, fields["hidden_size"])
    if all(mamba.mamba_layers):
        raise _refuse("layer_types", cfg.get("layer_types"), " (no attention layer at all)")
    if not any(mamba.mamba_layers):  # granite-4.0-micro (not -h): attention only, no state to keep
        mamba = None
    return {
        **_scalars(cfg),
        "intermediate_size": int(cfg.get("shared_intermediate_size", 1024)),  # the dense shared_mlp
        "rope_layers": None if rope == "rope" else (False,) * layers,
        "mamba": mamba,
        **({"moe": _moe(cfg)} if experts > 0 else {}),
    }


def _moe(cfg: dict[str, Any]) -> MoEConfig:
    experts, top_k = int(cfg.get("num_local_experts", 8) or 0), int(cfg.get("num_experts_per_tok", 2) or 0)
    if experts < 1 or not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("intermediate_size", 11008)),
        norm_topk_prob=False,
        softmax_after_topk=True,
    )


_MOE_NAMES = {
    ".block_sparse_moe.input_linear.weight": ".mlp.experts.gate_up_proj",  # split per expert by weight_stream
    ".block_sparse_moe.output_linear.weight": ".mlp.experts.down_proj",
    ".block_sparse_moe.router.layer.weight": ".mlp.gate.weight",
}


def granitemoe_name(name: str) -> str:
    """A GraniteMoE checkpoint name in the model files' terms (fused experts as transformers names them)."""
    for old, new in _MOE_NAMES.items():
        if name.endswith(old):
            return name.removesuffix(old) + new
    return name


def hybrid_name(name: str, dense: bool = False) -> str:
    """A Granite 4.0-H checkpoint name in the model files' terms: the experts as GraniteMoE's, the dense
    shared_mlp's fused input_linear as one gate_up_proj (split by weight_stream.split_fused), output_linear
    as down_proj. dense (a model without experts): an `mlp` is the shared_mlp, as mlx_lm names it there."""
    name = granitemoe_name(name)
    for old, new in (
        (".shared_mlp.input_linear.", ".shared_mlp.gate_up_proj."),
        (".shared_mlp.output_linear.", ".shared_mlp.down_proj."),
    ):
        if old in name:
            return name.replace(old, new)
    return name.replace(".mlp.", ".shared_mlp.") if dense else name
