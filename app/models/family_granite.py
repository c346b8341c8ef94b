"""Granite 3.x (model_type "granite": ibm-granite/granite-3.*-instruct; "granitemoe": granite-3.*-1b-a400m /
3b-a800m) and its relatives (Granite Swash, GraniteMoeShared, HyperCLOVA X SEED: Granite's layer with Peri-LN's
output norms): what its config.json means, as transformers' config classes read it, turned into ModelConfig fields.

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

from lantern.app.models.errors import UnsupportedModelError, check_attention_types, check_silu
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
    if model_type not in _TYPES:
        raise UnsupportedModelError(f"family_granite does not configure model_type {model_type!r}")
    if model_type == "granitemoehybrid":
        return _hybrid(cfg, fields)
    if model_type == "hyperclovax":
        return _hyperclovax(cfg, fields)
    check_silu(cfg, "Granite")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " for granite (biases on the projections)")
    out = {**_scalars(cfg), **(swa_attention(cfg, fields) if model_type.endswith("_swa") else {})}
    if model_type in ("granitemoe", "granitemoe_swa", "granitemoeshared"):
        out["moe"] = _moe(cfg)
        shared = int(cfg.get("shared_intermediate_size", 0) or 0)
        if shared and model_type != "granitemoe":  # a dense SwiGLU beside the experts: Granite 4.0's layer
            out.update(family="granite_hybrid", intermediate_size=shared)
    return out


# GraniteSWAConfig's defaults where they differ from GraniteConfig's (granitemoe_swa's are GraniteMoeShared's)
SWA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 100352,
    "hidden_size": 2560,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 20,
    "num_key_value_heads": 4,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 100257,
    "eos_token_id": 100257,
    "tie_word_embeddings": True,
}

_TYPES = (
    "granite",
    "granitemoe",
    "granitemoehybrid",
    "hyperclovax",
    "granite_swa",
    "granitemoe_swa",
    "granitemoeshared",
)


def swa_attention(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Granite Swash (granite_swa / granitemoe_swa): sliding layers where layer_types says (default: all but every
    4th from layer 0), a learned sink logit per head, a rope base per layer (layer_rope_theta; 0: no rope)."""
    layers = fields["num_layers"]
    types = cfg.get("layer_types") or ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)]
    check_attention_types(types, layers)
    window = cfg.get("sliding_window", 128)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise _refuse("sliding_window", window, " (a positive number of tokens)")
    no_rope = cfg.get("no_rope_layers")  # (llama.cpp's converter reads it; GraniteSWAConfig has no such key)
    if no_rope is not None and not all(no_rope) and cfg.get("layer_rope_theta") is None:
        raise _refuse("no_rope_layers", no_rope, " (transformers turns every layer: state layer_rope_theta)")
    thetas = cfg.get("layer_rope_theta") or [fields["rope_theta"]] * layers
    if len(thetas) != layers or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0 for t in thetas):
        raise _refuse("layer_rope_theta", thetas, f" (a rope base, or 0 for none, for each of {layers} layers)")
    bases = sorted({float(t) for t in thetas if t})
    if len(bases) > 1:  # (Lantern's Llama layer turns one rope table)
        raise _refuse("layer_rope_theta", thetas, " (more than one rope base among the layers)")
    return {
        "layer_windows": [window if t == "sliding_attention" else None for t in types] if window else None,
        "attn_sinks": True,
        "rope_theta": bases[0] if bases else fields["rope_theta"],
        "rope_layers": None if all(thetas) else tuple(bool(t) for t in thetas),
    }


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


def _hyperclovax(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """HyperCLOVA X SEED: Granite's scalars with the logits *multiplied* by logits_scaling, the query scale
    head_dim ** -0.5 unless attention_multiplier says otherwise, and (use_post_norm, default on) an RMSNorm on
    each sublayer's output before its residual multiplier (Peri-LN)."""
    check_silu(cfg, "HyperCLOVA X")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " for hyperclovax (biases on the projections)")
    if cfg.get("attention_multiplier") is None:
        cfg = {**cfg, "attention_multiplier": fields["head_dim"] ** -0.5}
    return {
        **_scalars(cfg),
        # (a divisor of 1 / scale: within an ulp of transformers' product)
        "logits_divisor": 1.0 / _scalar(cfg, "logits_scaling"),
        "post_norms": bool(cfg.get("use_post_norm", True)),
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
    # (transformers' own names, as it saves the models it has no original layout for: Granite Swash's MoE)
    ".block_sparse_moe.experts.gate_up_proj": ".mlp.experts.gate_up_proj",
    ".block_sparse_moe.experts.down_proj": ".mlp.experts.down_proj",
    ".block_sparse_moe.router.weight": ".mlp.gate.weight",
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
