"""Aria's language model (rhymes-ai/Aria: model_type aria_text, and the `aria` vision-language folders through
family_vl_wrappers), as transformers' AriaTextConfig reads its config.json, turned into ModelConfig fields.

The maths (transformers' modeling_aria): Llama's attention; every layer a mixture whose router picks moe_topk of
moe_num_experts by their logits and weights them by a softmax over the chosen logits (a renormalised softmax: family
_deepseek's greedy routing with norm_topk_prob), SiLU-gated experts intermediate_size wide, beside shared experts as
one SiLU-gated MLP intermediate_size x moe_num_shared_experts wide. Its experts are stored fused as bmm reads them
(fc1 = gate_up_proj [E, hidden, 2 x inner], fc2 = down_proj [E, inner, hidden]: turned as Llama 4's are).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# AriaTextConfig's defaults for the keys a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an aria_text config.json; refuses, naming the key, what it does not compute."""
    from lantern.app.models.family_deepseek import DeepSeekMoEConfig

    if model_type != "aria_text":
        raise UnsupportedModelError(f"family_aria does not configure model_type {model_type!r}")
    check_silu(cfg, "Aria")
    for key in ("mlp_bias", "attention_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for aria_text (biases on the projections)")
    experts, top_k, shared = (
        int(cfg.get("moe_num_experts", 8)),
        int(cfg.get("moe_topk", 2)),
        cfg.get("moe_num_shared_experts", 2),
    )
    if not 1 <= top_k <= experts:
        raise refuse("moe_topk", top_k, f" (must be between 1 and the {experts} experts)")
    width = fields["intermediate_size"]
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=width,
        norm_topk_prob=True,  # (a softmax over the chosen logits: the renormalised softmax's weights)
        router_weights_fp32=True,  # (its router runs in float32 here, in the model dtype in transformers: bf16
        # near-ties among the experts may go the other way there)
        shared_size=width * int(shared) if shared else None,
        norm_eps=0.0,
    )
    return {"moe": moe}


_FUSED = {".mlp.experts.fc1.weight": ".mlp.experts.gate_up_proj", ".mlp.experts.fc2.weight": ".mlp.experts.down_proj"}


def fused_expert_names(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Aria's fused experts (fc1 / fc2) under the names Llama 4's are turned by (weight_stream, before the split)."""
    for name, value in source:
        for old, new in _FUSED.items():
            name = name.replace(old, new)
        yield name, value


def checkpoint_name(name: str) -> str:
    """The router under the mixture model file's name."""
    return name.replace(".mlp.router.", ".mlp.gate.")
