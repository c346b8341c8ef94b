"""Jamba (ai21labs/AI21-Jamba-*, Jamba 1.5 / 1.6 / 1.7, Jamba Reasoning 3B: model_type jamba), as transformers'
JambaConfig reads its config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_jamba): layers of two kinds, attention where layer % attn_layer_period ==
attn_layer_offset and a Mamba-1 mixer elsewhere (family_mamba's, with RMSNorms of dt, B and C that have weights,
eps rms_norm_eps); attention without any positional encoding (no rope: ModelConfig.rope_layers all False) or
biases. Each layer: x + mixer(input_layernorm(x)), then + feed_forward(pre_ff_layernorm(x)): a mixture of
num_experts experts where layer % expert_layer_period == expert_layer_offset (softmax over the experts, the top-k
probabilities not renormalised), a SiLU-gated MLP elsewhere; a final RMSNorm and an untied head.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_silu, refuse
from lantern.app.models.family_mamba import mixer_config
from lantern.app.models.family_moe import MoEConfig

# JambaConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 262144,
}
_KINDS = ("attention", "mamba")


def layer_kinds(cfg: dict[str, Any], layers: int) -> list[str]:
    """Each layer's mixer, as JambaConfig.layers_block_type computes it (a stated list wins)."""
    stated = cfg.get("layers_block_type")
    if stated is not None:
        if len(stated) != layers or set(stated) - set(_KINDS):
            raise refuse("layers_block_type", stated, f" (one of {', '.join(_KINDS)} for each of {layers} layers)")
        return list(stated)
    period, offset = int(cfg.get("attn_layer_period", 8)), int(cfg.get("attn_layer_offset", 4))
    if not 0 <= offset < period:  # (JambaConfig raises)
        raise refuse("attn_layer_offset", offset, f" (must be below attn_layer_period {period})")
    return ["attention" if i % period == offset else "mamba" for i in range(layers)]


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a jamba config; refuses, naming the key, what it does not compute."""
    if model_type != "jamba":
        raise UnsupportedModelError(f"family_jamba does not configure model_type {model_type!r}")
    check_silu(cfg, "Jamba")
    layers = fields["num_layers"]
    kinds = layer_kinds(cfg, layers)
    if "attention" not in kinds:  # (no released Jamba lacks one; a Mamba-only model is model_type mamba)
        offset, period = cfg.get("attn_layer_offset", 4), cfg.get("attn_layer_period", 8)
        raise refuse("attn_layer_offset", offset, f" (with attn_layer_period {period}: no layer of {layers} attends)")
    out: dict[str, Any] = {
        "mamba1": mixer_config(cfg, tuple(k == "mamba" for k in kinds), "weighted", eps_key="rms_norm_eps"),
        "rope_layers": (False,) * layers,  # no positional encoding at all
        "rope_scaling": None,
        "attention_bias": False,
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "moe": _experts(cfg, layers),
    }
    return out


def _experts(cfg: dict[str, Any], layers: int) -> MoEConfig | None:
    stated = cfg.get("num_experts")
    experts = int(stated if stated is not None else cfg.get("num_local_experts", 16))  # (JambaConfig's alias)
    top_k = int(cfg.get("num_experts_per_tok", 2))
    if experts <= 1:
        return None  # every layer's MLP is dense (JambaConfig.layers_num_experts: 1 expert is an MLP)
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    per_layer = cfg.get("layers_num_experts")  # (as JambaConfig computes it; a GGUF's builder states it so)
    if per_layer is not None:
        if len(per_layer) != layers or any(n not in (1, experts) for n in per_layer):
            raise refuse("layers_num_experts", per_layer, f" (1 or {experts} for each of {layers} layers)")
        dense = tuple(i for i, n in enumerate(per_layer) if n == 1)
    else:
        period, offset = int(cfg.get("expert_layer_period", 2)), int(cfg.get("expert_layer_offset", 1))
        if not 0 <= offset < period:  # (JambaConfig raises)
            raise refuse("expert_layer_offset", offset, f" (must be below expert_layer_period {period})")
        dense = tuple(i for i in range(layers) if i % period != offset)
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=False,
        dense_layers=dense,
    )


def checkpoint_name(name: str) -> str:
    """A Jamba tensor under the model files' names: feed_forward as mlp (its router as mlp.gate), pre_ff_layernorm
    as post_attention_layernorm, final_layernorm as the model's norm."""
    if name.startswith("model.final_layernorm."):
        return "model.norm." + name.removeprefix("model.final_layernorm.")
    name = name.replace(".feed_forward.router.", ".mlp.gate.").replace(".feed_forward.", ".mlp.")
    return name.replace(".pre_ff_layernorm.", ".post_attention_layernorm.")
