"""EXAONE 3.0 / 3.5 / Deep (LGAI-EXAONE/EXAONE-3.5-*, EXAONE-Deep-*: model_type exaone), as transformers'
ExaoneConfig reads its config.json: Llama's model under other names (transformers 5 loads it as LlamaForCausalLM,
renaming the tensors as checkpoint_name does).

The released configs name three keys their own way (ExaoneConfig.attribute_map): num_layers, layer_norm_epsilon
and activation_function; prepare() states them under Llama's names, with ExaoneConfig's rope base (500000) where
the config states none. Llama's checks (spec._check_unimplemented) then apply.
"""

from __future__ import annotations

import re
from typing import Any

from lantern.app.models.errors import UnsupportedModelError

# ExaoneConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 102400,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}
_KEYS = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps", "activation_function": "hidden_act"}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json under Llama's key names (the released names win over the defaults merged before)."""
    out = dict(cfg)
    for theirs, llama in _KEYS.items():
        if theirs in out:
            out[llama] = out[theirs]
    out.setdefault("num_hidden_layers", 32)
    if not (out.get("rope_parameters") or {}).get("rope_theta"):
        out.setdefault("rope_theta", 500_000.0)  # ExaoneConfig.default_theta
    return out


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Nothing beyond Llama's fields (spec runs Llama's checks for this model type)."""
    if model_type != "exaone":
        raise UnsupportedModelError(f"family_exaone3 does not configure model_type {model_type!r}")
    return {}


_RENAMES = (
    (re.compile(r"^transformer\.wte\."), "model.embed_tokens."),
    (re.compile(r"^transformer\.h\."), "model.layers."),
    (re.compile(r"^transformer\.ln_f\."), "model.norm."),
    (re.compile(r"\.attn\.attention\.out_proj\."), ".self_attn.o_proj."),
    (re.compile(r"\.attn\.attention\."), ".self_attn."),
    (re.compile(r"\.ln_1\."), ".input_layernorm."),
    (re.compile(r"\.ln_2\."), ".post_attention_layernorm."),
    (re.compile(r"\.mlp\.c_fc_0\."), ".mlp.gate_proj."),
    (re.compile(r"\.mlp\.c_fc_1\."), ".mlp.up_proj."),
    (re.compile(r"\.mlp\.c_proj\."), ".mlp.down_proj."),
)


def checkpoint_name(name: str) -> str:
    """An EXAONE checkpoint's tensor name (transformer.h.N.attn.attention.q_proj, ...) as Llama's."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name
