"""GPT-J (EleutherAI/gpt-j-6b, GPT4All-J, Pygmalion-6B, and fine-tunes: model_type gptj) and CodeGen
(Salesforce/codegen-*-mono / multi / nl: model_type codegen; CodeGen2's remote code, auto_map, is refused), as
transformers' GPTJConfig / CodeGenConfig read their config.json (defaults included), turned into ModelConfig fields;
both run in the Phi model files.

The maths (transformers' modeling_gptj): one LayerNorm (ln_1) whose output feeds attention and the MLP side by side,
both joining the stream; attention without biases whose rope turns consecutive pairs (rotate_every_two) of the first
rotary_dim dims of each head (default 64; every dim when rotary_dim is null), base 10000; an ungated MLP
fc_out(act(fc_in(x))) with biases (activation_function gelu_new: the tanh GELU), n_inner or 4 x n_embd wide; a final
LayerNorm ln_f and an untied head with a bias. CodeGen is GPT-J's block with q, v and k in one qkv_proj laid out for
the 4 model-parallel shards it was trained on: per shard [q, v, k] rows of its quarter of the heads (reordered to q,
k, v rows while loading).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.grouped_qkv import reorder_rows

_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}
# GPTJConfig's defaults, and its attribute_map: its n_* keys and the standard names mean the same
_DEFAULTS = {"vocab_size": 50400, "hidden_size": 4096, "num_hidden_layers": 28, "num_attention_heads": 16}
_KEYS = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "max_position_embeddings": "n_positions",
}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads."""
    out = {**_DEFAULTS, **cfg}
    for key, short in _KEYS.items():
        if short in cfg:
            out[key] = cfg[short]
    out.setdefault("max_position_embeddings", 2048)
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    head_dim = hidden // heads
    rotary = out.get("rotary_dim", 64) or head_dim  # (GPTJAttention: rotary_dim null turns whole heads)
    if rotary > head_dim or rotary % 2:
        raise refuse("rotary_dim", rotary, f" (an even count of at most head_dim {head_dim})")
    return {
        **out,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "intermediate_size": out.get("n_inner") or 4 * hidden,
        "partial_rotary_factor": rotary / head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern does not compute."""
    if model_type == "codegen" and cfg.get("auto_map"):  # CodeGen2: its own modeling code, not transformers'
        raise refuse("auto_map", cfg["auto_map"], " (CodeGen2's own modeling code: transformers' CodeGen layout only)")
    if model_type == "codegen" and fields["hidden_size"] % (_SHARDS * fields["head_dim"]):
        raise refuse("n_head", fields["num_heads"], f" (CodeGen's fused q/k/v needs heads in {_SHARDS} equal shards)")
    if model_type not in ("gptj", "codegen"):
        raise UnsupportedModelError(f"family_gptj does not configure model_type {model_type!r}")
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACTS:
        raise refuse("activation_function", act, f"; supported: {', '.join(_ACTS)}")
    if cfg.get("tie_word_embeddings"):  # (the head's bias would have to be added to the embedding's logits)
        raise refuse("tie_word_embeddings", True, f" for {model_type} (a tied head with its bias)")
    return {
        "hidden_act": _ACTS[act],
        "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
        "attention_bias": False,
        "mlp_bias": True,
        "lm_head_bias": True,
        "rope_interleaved": True,
        "tie_word_embeddings": False,
    }


_SHARDS = 4  # CodeGenAttention.mp_num
_LAYER = {
    "ln_1": "input_layernorm",
    "attn.qkv_proj": "self_attn.qkv_proj",  # (CodeGen's)
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.out_proj": "self_attn.o_proj",
    "mlp.fc_in": "mlp.up_proj",
    "mlp.fc_out": "mlp.down_proj",
}
_GLOBAL = {"transformer.wte": "model.embed_tokens", "transformer.ln_f": "model.norm", "lm_head": "lm_head"}
_LAYER_RE = re.compile(r"^transformer\.h\.(\d+)\.([a-z_0-9.]+)\.([a-z_]+)$")  # (quantized modules' parts too)


def checkpoint_name(name: str) -> str | None:
    """A GPT-J checkpoint's tensor under the model files' name; None for what is not loaded (older checkpoints'
    stored attention masks, attn.bias / attn.masked_bias)."""
    m = _LAYER_RE.match(name)
    if m is not None:
        if m.group(2) == "attn":  # attn.bias / attn.masked_bias
            return None
        mapped = _LAYER.get(m.group(2))
        return name if mapped is None else f"model.layers.{m.group(1)}.{mapped}.{m.group(3)}"
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL[stem]}.{kind}" if stem in _GLOBAL else name  # (unknown: refused by name)


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """CodeGen's qkv_proj rows (per shard: q, v, k of its heads) as q rows, then k, then v (weight_stream.split_fused
    cuts them); GPT-J's stream as it is."""
    cfg = spec.config
    if cfg.architecture != "codegen":
        yield from source
        return
    local = cfg.hidden_size // _SHARDS
    shards = np.arange(_SHARDS)[:, None] * 3 * local + np.arange(local)[None, :]
    order = np.concatenate([shards.reshape(-1), (shards + 2 * local).reshape(-1), (shards + local).reshape(-1)])
    for name, value in source:
        yield name, reorder_rows(value, order) if ".self_attn.qkv_proj." in name else value
