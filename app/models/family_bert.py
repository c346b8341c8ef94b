"""BERT encoders (model_type "bert": all-MiniLM, bge, e5, ...): what config.json means, as
transformers' BertConfig / BertModel read it, turned into ModelConfig fields; and the checkpoint's
tensor names in the model files' terms.

The maths (transformers' modeling_bert, BertModel): embeddings = LayerNorm(word + token type +
absolute position), then per layer bidirectional multi-head attention with q/k/v/o biases, a
post-LN residual (LayerNorm(x + attention)), an MLP of two biased linears around GELU and a
second post-LN residual. The last layer's output is the hidden state the pooling reads; BERT's
own pooler (a tanh dense on [CLS]) is not what sentence-transformers use, so it is not loaded.

An encoder keeps no KV cache and is served for embeddings only (`--task embed`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lantern.app.models.spec import UnsupportedModelError

# transformers' ACT2FN names for the two GELUs the model files compute.
_GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class EncoderConfig:
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str  # "gelu" (erf) or "gelu_tanh"


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a bert config (called by spec.ModelConfig.from_hf)."""
    if model_type != "bert":
        raise UnsupportedModelError(f"family_bert does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "gelu")
    if act not in _GELU:
        raise _refuse("hidden_act", act, f"; supported: {', '.join(sorted(_GELU))}")
    position = cfg.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise _refuse("position_embedding_type", position, " (only absolute position embeddings)")
    for key in ("is_decoder", "add_cross_attention"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (Lantern serves BERT as an encoder)")
    if cfg.get("quantization_config"):
        raise _refuse("quantization_config", cfg["quantization_config"].get("quant_method"), " for BERT encoders")
    if fields["hidden_size"] % fields["num_heads"]:
        raise _refuse("num_attention_heads", fields["num_heads"], " (it must divide hidden_size)")
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    return {
        "encoder": EncoderConfig(int(cfg.get("type_vocab_size", 2)), eps, _GELU[act]),
        "num_kv_heads": fields["num_heads"],
        "rms_norm_eps": eps,  # unused by the encoder (its norms are LayerNorms): kept equal to avoid a second value
        "rope_scaling": None,
        "tie_word_embeddings": False,  # BertConfig says True for its MLM head, which is not loaded
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 512)),
        "eos_token_ids": [],
        "attention_bias": True,
    }


_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
# Per-layer tensors: HF module path -> the model files' (q/k/v named like the decoders', so the
# torch loader stacks them into one qkv_proj).
_LAYER_NAMES = {
    "attention.self.query": "attention.q_proj",
    "attention.self.key": "attention.k_proj",
    "attention.self.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "mlp.up_proj",
    "output.dense": "mlp.down_proj",
    "output.LayerNorm": "mlp_norm",
}
_KINDS = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}  # old checkpoints: gamma/beta


def bert_weight_name(name: str) -> str | None:
    """A BERT checkpoint tensor under the model files' name; None for tensors not loaded (the
    pooler, MLM / NSP heads, the position_ids buffer old checkpoints saved). A BertForXxx
    checkpoint's "bert." prefix is dropped."""
    if name.startswith("bert."):
        name = name[len("bert.") :]
    if name.startswith(("pooler.", "cls.")) or name in ("embeddings.position_ids", "embeddings.token_type_ids"):
        return None
    module, _, kind = name.rpartition(".")
    if kind not in _KINDS:
        raise UnsupportedModelError(f"unexpected tensor {name} in a BERT checkpoint")
    kind = _KINDS[kind]
    if module == "embeddings.LayerNorm":
        return f"embeddings.norm.{kind}"
    if module.startswith("embeddings."):
        return f"{module}.{kind}"
    m = _LAYER.match(module)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise UnsupportedModelError(f"unexpected tensor {name} in a BERT checkpoint")
    return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{kind}"
