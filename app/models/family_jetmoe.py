"""JetMoE (jetmoe/jetmoe-8b and -8b-chat; model_type "jetmoe"), as transformers' JetMoeConfig reads its
config.json, turned into ModelConfig fields, and its checkpoint's tensors under the model files' names.

The maths (transformers' modeling_jetmoe): Llama's pre-norm layer (RMSNorm, eps 1e-6 in every layer whatever
rms_norm_eps says -- the final norm reads it) whose attention and MLP are both mixtures of experts routed the same
way: the top num_experts_per_tok of a bias-free router's logits (float32), weights a softmax over those k.

* Mixture of attention (MoA): one K/V projection (kv_proj, num_key_value_heads heads of kv_channels, a plain rope)
  shared by every expert; each chosen expert e projects the token's queries, W_q[e] x (num_key_value_heads heads),
  so a token has k x num_key_value_heads query heads, head j of slot s reading K/V head j (transformers tiles the K/V
  heads); each slot's attention output goes through its expert's W_o[e], weighted by the router, summed, plus a
  bias.
* The MLP: Mixtral-style SiLU-gated experts ([gate; up] stored as one [2 I, d] matrix per expert) plus a bias.

The pool holds num_key_value_heads heads per layer; the queries are grouped head-major for it (head j's k slots
together), and their outputs put back in slot order before W_o.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.spec import UnsupportedModelError

# JetMoeConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "num_hidden_layers": 12,
    "num_key_value_heads": 16,
    "kv_channels": 128,
    "intermediate_size": 5632,
    "max_position_embeddings": 4096,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys spec.ModelConfig.from_hf reads, as JetMoeConfig derives them: heads = K/V heads x experts per token,
    head_dim = kv_channels."""
    heads = int(cfg["num_key_value_heads"]) * int(cfg["num_experts_per_tok"])
    return {**cfg, "num_attention_heads": heads, "head_dim": int(cfg["kv_channels"])}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a jetmoe config.json; refuses, naming the key, what it does not compute."""
    if model_type != "jetmoe":
        raise UnsupportedModelError(f"family_jetmoe does not configure model_type {model_type!r}")
    act = cfg.get("activation_function", "silu")
    if act != "silu":
        raise refuse("activation_function", act, " (SiLU-gated experts)")
    if float(cfg.get("rms_norm_eps", 1e-6)) != 1e-6:  # (the layers' norms are built with 1e-6 whatever it says)
        raise refuse("rms_norm_eps", cfg["rms_norm_eps"], " (JetMoE's layer norms use 1e-6, its final norm this)")
    experts, top_k = int(cfg["num_local_experts"]), int(cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (1 to the {experts} num_local_experts)")
    moe = MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=fields["intermediate_size"],
        norm_topk_prob=True,
        softmax_after_topk=True,
    )
    return {"moe": moe, "num_kv_heads": int(cfg["num_key_value_heads"]), "layer_windows": None}


def checkpoint_name(name: str) -> str:
    """The MoA's tensors under the model files' names (its experts' 3-D query / output matrices kept whole); the
    MLP's router as a mixture's `gate` (its experts are split by checkpoint_tensors)."""
    for old, new in _NAMES.items():
        if old in name:
            return name.replace(old, new)
    return name


_NAMES = {
    ".self_attention.experts.input_linear.weight": ".self_attn.q_experts",
    ".self_attention.experts.output_linear.weight": ".self_attn.o_experts",
    ".self_attention.experts.bias": ".self_attn.o_bias",
    ".self_attention.experts.router.layer.": ".self_attn.router.",
    ".self_attention.kv_proj.": ".self_attn.kv_proj.",
    ".mlp.router.layer.": ".mlp.gate.",
}


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """Each MLP expert's [gate; up] and down matrices (stored stacked [E, 2 I, d] and [E, d, I]) as Mixtral's
    mlp.experts.{e}.gate_proj / up_proj / down_proj."""
    inner = spec.config.intermediate_size
    for name, value in source:
        stem = name.removesuffix(".mlp.input_linear.weight")
        if stem != name:
            for e in range(value.shape[0]):
                yield f"{stem}.mlp.experts.{e}.gate_proj.weight", value[e, :inner]
                yield f"{stem}.mlp.experts.{e}.up_proj.weight", value[e, inner:]
            continue
        stem = name.removesuffix(".mlp.output_linear.weight")
        if stem != name:
            for e in range(value.shape[0]):
                yield f"{stem}.mlp.experts.{e}.down_proj.weight", value[e]
            continue
        yield name, value
