"""ModernBERT encoders (model_type "modernbert": gte-modernbert, modernbert-embed, ModernBERT-base/large): what
config.json means, as transformers' ModernBertConfig / ModernBertModel read it, and the checkpoint's tensor names.

The maths (transformers' modeling_modernbert): embeddings = LayerNorm(word) (no positions: a rope in every layer),
then pre-norm layers (layer 0 without the attention norm): x + Wo(attention(norm(x))), x + Wo(act(a) * g) with
[a, g] = Wi(norm(x)) (GeGLU). Attention is bidirectional; most layers are local (every key within
local_attention / 2 positions of the query, rope base 10000), one in global_attn_every_n_layers is global (rope
base 160000). Norms are LayerNorms without bias unless norm_bias; linears without bias unless attention_bias /
mlp_bias. The last layer's output goes through final_norm; that is the hidden state the pooling reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import UnsupportedModelError

_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_THETAS = {"full_attention": ("global_rope_theta", 160_000.0), "sliding_attention": ("local_rope_theta", 10_000.0)}


@dataclass(frozen=True)
class ModernBertConfig:
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str  # "gelu" (erf) or "gelu_tanh"
    local: tuple[bool, ...]  # per layer: a sliding (local) layer
    half_window: int  # a local layer's keys: |query - key| <= half_window
    global_theta: float
    local_theta: float
    matrices_per_layer: int = 4  # Wqkv, Wo, Wi, the MLP's Wo (isq_candidates)


def _refuse(key: str, value: Any, why: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def _theta(cfg: dict[str, Any], kind: str) -> float:
    params = (cfg.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise _refuse(f"rope_parameters.{kind}.rope_type", params["rope_type"])
    if cfg.get("rope_scaling"):
        raise _refuse("rope_scaling", cfg["rope_scaling"])
    key, default = _THETAS[kind]
    return float(params.get("rope_theta", cfg.get(key, default)))


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a modernbert config (called by spec.ModelConfig.from_hf)."""
    if model_type != "modernbert":
        raise UnsupportedModelError(f"family_modernbert does not configure model_type {model_type!r}")
    served = ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification")
    heads = [a for a in cfg.get("architectures") or [] if a not in served]
    if heads:
        raise UnsupportedModelError(
            f"architectures={json.dumps(heads)} in config.json is not implemented: Lantern serves ModernBERT "
            "encoders for embeddings and cross-encoders (ModernBertModel, ModernBertForMaskedLM, "
            "ModernBertForSequenceClassification)"
        )
    act = cfg.get("hidden_activation", "gelu")
    if act not in _ACT:
        raise _refuse("hidden_activation", act, f"; supported: {', '.join(sorted(_ACT))}")
    layers = fields["num_layers"]
    every = int(cfg.get("global_attn_every_n_layers", 3))
    kinds = cfg.get("layer_types") or ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    if len(kinds) != layers or set(kinds) - set(_THETAS):
        raise _refuse("layer_types", kinds)
    if fields["hidden_size"] % fields["num_heads"]:
        raise _refuse("num_attention_heads", fields["num_heads"], " (it must divide hidden_size)")
    if cfg.get("quantization_config"):
        raise _refuse("quantization_config", cfg["quantization_config"].get("quant_method"), " for encoders")
    modern = ModernBertConfig(
        norm_eps=float(cfg.get("norm_eps", 1e-5)),
        norm_bias=bool(cfg.get("norm_bias", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        hidden_act=_ACT[act],
        local=tuple(kind == "sliding_attention" for kind in kinds),
        half_window=int(cfg.get("local_attention", 128)) // 2,
        global_theta=_theta(cfg, "full_attention"),
        local_theta=_theta(cfg, "sliding_attention"),
    )
    return {
        "encoder": modern,
        "num_kv_heads": fields["num_heads"],
        "rms_norm_eps": modern.norm_eps,  # unused (LayerNorms): kept equal to avoid a second value
        "rope_scaling": None,
        "tie_word_embeddings": False,  # the MLM decoder is not loaded
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 8192)),
        "eos_token_ids": [],
    }


_SKIPPED = ("head.", "decoder.", "classifier.")


def checkpoint_name(name: str) -> str | None:
    """A ModernBERT checkpoint tensor under the model files' name (HF's, without a ForMaskedLM's "model." prefix);
    None for the MLM head and decoder, which are not loaded, and a cross-encoder's head (score_head.py reads it)."""
    if name.startswith(_SKIPPED):
        return None
    return name[len("model.") :] if name.startswith("model.") else name
