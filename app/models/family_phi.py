"""Phi-1 / Phi-1.5 / Phi-2 (microsoft/phi-*: model_type phi), as transformers' PhiConfig reads its config.json
(defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_phi): one LayerNorm with a bias per layer whose output feeds attention and the
MLP in parallel, both added to the residual stream (Cohere's block, backends/*/models/phi.py); attention with
biases on q, k, v and its output projection `dense`, the rope on the first partial_rotary_factor of each head
(rotate_half; PhiConfig's default 0.5, the released Phi-2 0.4); an ungated MLP fc2(gelu_new(fc1(x))) with biases
(gelu_new is the tanh approximation); a final LayerNorm and a head with a bias. qk_layernorm (LayerNorms over
each head of q and k; no released checkpoint sets it) is refused.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.rope_config import with_default_partial
from lantern.app.models.spec import UnsupportedModelError

# PhiConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 51200,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # one function: GELU's tanh approximation


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a phi config; refuses, naming the key, what it does not compute."""
    if model_type != "phi":
        raise UnsupportedModelError(f"family_phi does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "gelu_new")
    if act not in _ACTIVATIONS:
        raise refuse("hidden_act", act, f"; supported: {', '.join(_ACTIVATIONS)}")
    if cfg.get("qk_layernorm"):
        raise refuse("qk_layernorm", cfg["qk_layernorm"], " (LayerNorms over each head of q and k)")
    if cfg.get("tie_word_embeddings"):  # (the head's bias would have to be added to the embedding's logits)
        raise refuse("tie_word_embeddings", True, " for phi (a tied head with its bias)")
    rope = with_default_partial(cfg, fields["rope_scaling"], 0.5)  # (PhiConfig's default)
    return {
        "hidden_act": "gelu_tanh",
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),  # (its LayerNorms' eps)
        "attention_bias": True,
        "mlp_bias": True,
        "lm_head_bias": True,
        "rope_scaling": rope,
        "tie_word_embeddings": False,
    }


_RENAMES = (
    (".self_attn.dense.", ".self_attn.o_proj."),
    (".mlp.fc1.", ".mlp.up_proj."),
    (".mlp.fc2.", ".mlp.down_proj."),
)


def checkpoint_name(name: str) -> str:
    """A Phi tensor name in the model files' terms (its final norm is final_layernorm)."""
    if name.startswith("model.final_layernorm."):
        return "model.norm." + name.removeprefix("model.final_layernorm.")
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return name
