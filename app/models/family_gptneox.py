"""GPT-NeoX (EleutherAI's Pythia and GPT-NeoX-20B, StableLM-Alpha, RedPajama-INCITE, Dolly v2, OpenAssistant's
SFT models: model_type gpt_neox) and Falcon (tiiuae/falcon-7b / 40b / 180b, Falcon2-11B: model_type falcon), as
transformers' GPTNeoXConfig / FalconConfig read their config.json (defaults included), turned into ModelConfig
fields. Both run in the Phi model files (attention and an ungated MLP side by side under LayerNorms).

The maths (transformers' modeling_gpt_neox / modeling_falcon):
- GPT-NeoX: attention and the MLP each read their own LayerNorm of the same stream (input_layernorm,
  post_attention_layernorm: ModelConfig.mlp_norm) and both join it (use_parallel_residual, the default); without
  it the layer is sequential (the Jais 2 model files). q/k/v in one query_key_value, each head's q, k, v
  together (reordered while loading); the rope (rotate_half) on the first partial_rotary_factor of each head
  (rotary_pct, default 0.25; base rotary_emb_base), biases where attention_bias (default true) on attention,
  always on the MLP (exact GELU by default), an untied head embed_out.
- Falcon: the same parallel block without biases (bias, default false), the rope on whole heads, an exact GELU
  MLP ffn_hidden_size wide (4 x hidden by default), the head tied. Its fused query_key_value: multi_query (7B)
  holds every query head, then one key and one value head; new_decoder_architecture (40B / 180B / Falcon2)
  holds num_kv_heads groups of [the group's query heads, a key, a value] and two LayerNorms, ln_attn and ln_mlp
  (num_ln_in_parallel_attn 2, its default) or one; otherwise each head's q, k, v sit together. ALiBi models
  (Falcon-RW) and sequential old-architecture layers (parallel_attn false, which only they use) are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.grouped_qkv import reorder_rows, stacked_order

_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_NEOX = {
    "vocab_size": 50432,
    "hidden_size": 6144,
    "num_hidden_layers": 44,
    "num_attention_heads": 64,
    "intermediate_size": 24576,
    "max_position_embeddings": 2048,
}
_FALCON = {"vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads: GPT-NeoX's rotary_pct / rotary_emb_base as the rope's
    partial_rotary_factor / rope_theta (where rope_parameters states neither), Falcon's KV heads and MLP width."""
    if cfg.get("model_type") == "falcon":
        out = {**_FALCON, **cfg}
        out["hidden_size"] = cfg.get("n_embed", out["hidden_size"])  # (FalconConfig's older name)
        heads = out["num_attention_heads"]
        if out.get("new_decoder_architecture"):
            kv = out.get("num_kv_heads") or heads
        else:
            kv = 1 if out.get("multi_query", True) else heads
        return {
            **out,
            "num_key_value_heads": kv,
            "head_dim": out["hidden_size"] // heads,
            "intermediate_size": out.get("ffn_hidden_size") or 4 * out["hidden_size"],
            "max_position_embeddings": out.get("max_position_embeddings", 2048),
        }
    out = {**_NEOX, **cfg}
    rope = dict(out.get("rope_parameters") or {})
    rope.setdefault("rope_theta", out.get("rotary_emb_base", 10000.0))
    rope.setdefault("partial_rotary_factor", out.get("rotary_pct", 0.25))
    rope.setdefault("rope_type", "default")
    heads = out["num_attention_heads"]
    return {
        **out,
        "rope_parameters": rope,
        "partial_rotary_factor": rope["partial_rotary_factor"],
        "num_key_value_heads": heads,
        "head_dim": out["hidden_size"] // heads,
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern does not compute."""
    if model_type == "falcon":
        return _falcon(cfg)
    if model_type != "gpt_neox":
        raise UnsupportedModelError(f"family_gptneox does not configure model_type {model_type!r}")
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise refuse("hidden_act", act, f"; supported: {', '.join(_ACTS)}")
    parallel = bool(cfg.get("use_parallel_residual", True))
    return {
        "family": "phi" if parallel else "jais2",
        "hidden_act": _ACTS[act],
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),
        "attention_bias": bool(cfg.get("attention_bias", True)),
        "mlp_bias": True,
        "mlp_norm": parallel,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }


def _falcon(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("alibi"):
        raise refuse("alibi", True, " (ALiBi position biases: Falcon-RW)")
    act = cfg.get("activation", "gelu")
    if act not in _ACTS:
        raise refuse("activation", act, f"; supported: {', '.join(_ACTS)}")
    new = bool(cfg.get("new_decoder_architecture"))
    norms = cfg.get("num_ln_in_parallel_attn") or (2 if new else 1)
    if not cfg.get("parallel_attn", True):
        raise refuse("parallel_attn", False, " (sequential Falcon layers: only its ALiBi models have them)")
    if norms == 2 and not new:  # (FalconDecoderLayer would read an input_layernorm it never made)
        raise refuse("num_ln_in_parallel_attn", 2, " without new_decoder_architecture")
    bias = bool(cfg.get("bias", False))
    return {
        "hidden_act": _ACTS[act],
        "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
        "attention_bias": bias,
        "mlp_bias": bias,
        "mlp_norm": norms == 2,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


_NEOX_LAYER = {
    "attention.query_key_value": "self_attn.qkv_proj",
    "attention.dense": "self_attn.o_proj",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm",
}
_FALCON_LAYER = {
    "self_attention.query_key_value": "self_attn.qkv_proj",
    "self_attention.dense": "self_attn.o_proj",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "input_layernorm": "input_layernorm",
    "ln_attn": "input_layernorm",
    "ln_mlp": "post_attention_layernorm",
}
_GLOBAL = {
    "gpt_neox.embed_in": "model.embed_tokens",
    "gpt_neox.final_layer_norm": "model.norm",
    "embed_out": "lm_head",
    "transformer.word_embeddings": "model.embed_tokens",
    "transformer.ln_f": "model.norm",
    # mlx_lm's GPT-NeoX folders (its sanitize: "model." before every name, gpt_neox.layers as h)
    "model.embed_in": "model.embed_tokens",
    "model.final_layer_norm": "model.norm",
    "model.embed_out": "lm_head",
}
# (any last part: weight and bias, and a quantized module's qweight / scales / ... alike)
_LAYER_RE = re.compile(r"^(gpt_neox\.layers|model\.h|transformer\.h)\.(\d+)\.(.+)\.([a-z_]+)$")
_BUFFERS = ("attention", "attention.rotary_emb", "self_attention.rotary_emb")  # masks and inv_freq: not weights


def checkpoint_name(name: str) -> str | None:
    """A GPT-NeoX / Falcon checkpoint's tensor under the model files' name (Hugging Face's or mlx_lm's); None for
    the stored buffers of older checkpoints (attention masks, the rope's inv_freq), which are not loaded. An
    unknown name is kept: the model files then refuse it by name."""
    m = _LAYER_RE.match(name)
    if m is not None:
        stack, layer, part, kind = m.groups()
        if part in _BUFFERS:
            return None
        mapped = (_FALCON_LAYER if stack == "transformer.h" else _NEOX_LAYER).get(part)
        return name if mapped is None else f"model.layers.{layer}.{mapped}.{kind}"
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL[stem]}.{kind}" if stem in _GLOBAL else name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each fused query_key_value's rows reordered to q, then k, then v (a Hugging Face folder's;
    llama.cpp's converter reorders them so in GGUF files). A Falcon 40B GGUF holds ln_mlp as attn_norm and ln_attn
    as attn_norm_2 (the `gguf` package's map; llama.cpp's graph feeds attn_norm to the MLP when attn_norm_2
    exists): gguf_names reads them as input_layernorm / post_attention_layernorm, swapped back here."""
    cfg = spec.config
    if spec.weight_format == "gguf":
        if cfg.architecture != "falcon" or not cfg.mlp_norm:
            yield from source
            return
        swap = {"input_layernorm": "post_attention_layernorm", "post_attention_layernorm": "input_layernorm"}
        for name, value in source:
            stem, _, kind = name.rpartition(".")
            layer, _, part = stem.rpartition(".")
            yield (f"{layer}.{swap[part]}.{kind}" if part in swap else name), value
        return
    kv, heads = cfg.num_kv_heads, cfg.num_heads
    # per KV group: its query heads, a key, a value (a group per head where every head has its own K/V)
    order = stacked_order(kv, heads // kv, cfg.head_dim)
    for name, value in source:
        if ".self_attn.qkv_proj." in name:
            value = reorder_rows(value, order)
        yield name, value
