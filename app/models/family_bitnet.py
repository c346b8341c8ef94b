"""BitNet b1.58 (model_type "bitnet": microsoft/bitnet-b1.58-2B-4T), as transformers' BitNetConfig reads its
config.json (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_bitnet): Llama's pre-norm layer and rope with "subln" norms: an RMSNorm of the
attention's output before o_proj (self_attn.attn_sub_norm) and of the gated MLP's product before down_proj
(mlp.ffn_sub_norm) -- ModelConfig.sub_norms --, and a relu^2-gated MLP (hidden_act "relu2"). The ternary weights
and 8-bit activations belong to the checkpoint's quantization (quant/bitnet.py: `quant_method: "bitnet"`), which
any family may carry; a BitNet config without one is a float model, as transformers runs it.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# BitNetConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 2560,
    "intermediate_size": 6912,
    "num_hidden_layers": 30,
    "num_attention_heads": 20,
    "num_key_value_heads": 5,
    "hidden_act": "relu2",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,  # BitNetConfig.default_theta
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
_GATED = ("relu2", "silu", "swish")  # the gated activations both backends' MLP computes


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a bitnet config; refuses, naming the key, what it does not compute."""
    if model_type != "bitnet":
        raise UnsupportedModelError(f"family_bitnet does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "relu2")
    if act not in _GATED:
        raise refuse("hidden_act", act, f" for bitnet ({', '.join(_GATED)})")
    if cfg.get("attention_bias"):  # (LlamaAttention's would bias o_proj too)
        raise refuse("attention_bias", cfg["attention_bias"], " for bitnet (biases on the projections)")
    return {"hidden_act": "silu" if act == "swish" else act, "sub_norms": True}
