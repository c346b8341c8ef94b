"""GPT-2 (openai-community/gpt2*, DistilGPT2, and the many fine-tunes of them: model_type gpt2), StarCoder /
SantaCoder / WizardCoder / OctoCoder (model_type gpt_bigcode), OPT (facebook/opt-*: model_type opt) and GPT-Neo
(EleutherAI/gpt-neo-125m / 1.3B / 2.7B: model_type gpt_neo), as transformers' GPT2Config / GPTBigCodeConfig /
OPTConfig / GPTNeoConfig read their config.json (defaults included), turned into ModelConfig fields. All four
run in the Jais 2 model files (Llama's sequential layer under LayerNorms with biases, biased attention, an ungated
MLP with biases) with a learned absolute position table added to the token embedding
(ModelConfig.learned_positions) and no rope.

The maths (transformers' modeling_gpt2 / modeling_gpt_bigcode / modeling_opt / modeling_gpt_neo):
- GPT-2: q/k/v in one c_attn, stored by its Conv1D as [in, out] (every matrix is; transposed while loading
  unless mlx_lm saved the folder, whose names start "model."), scores scaled by head_dim ** -0.5 (by 1 without
  scale_attn_weights), activation_function gelu_new (tanh GELU) by default, n_inner or 4 * n_embd wide, a
  final LayerNorm ln_f, the head tied to the embedding. scale_attn_by_inverse_layer_idx (a score scale per
  layer) is refused.
- GPT-BigCode: GPT-2's block in nn.Linear layout; multi_query (the released models) gives one K/V head, q
  rows then k then v in c_attn; without it each head's q, k, v sit together (reordered while loading).
- OPT: separate q/k/v projections (queries scaled by head_dim ** -0.5), ReLU MLP fc1 / fc2 ffn_dim wide,
  positions offset by 2 in its table (the first two rows never read: dropped while loading). OPT-350m's
  post-norm layers (do_layer_norm_before false) and its projection between embedding and model widths
  (word_embed_proj_dim) are refused by name.
- GPT-Neo: GPT-2's block in nn.Linear layout with separate q/k/v projections without biases (out_proj has one:
  ModelConfig.attn_out_bias), scores not scaled at all, layers global or local by attention_types (expanded as
  GPTNeoConfig does: [[["global", "local"], 12]] alternates over 24 layers), a local layer's query attending to
  the window_size keys up to itself; intermediate_size or 4 * hidden_size wide, gelu_new by default.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.grouped_qkv import reorder_rows, stacked_order

_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}
_ACTS_OPT = {**_ACTS, "relu": "relu"}
# GPT2Config / GPTBigCodeConfig / OPTConfig defaults for the keys a config.json may omit
_GPT2 = {"vocab_size": 50257, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
_OPT = {"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072}
_NEO = {"vocab_size": 50257, "hidden_size": 2048, "num_layers": 24, "num_heads": 16, "max_position_embeddings": 2048}
# GPT2Config's attribute_map: its n_* keys and the standard names mean the same
_GPT2_KEYS = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "max_position_embeddings": "n_positions",
}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads (GPT-2's n_* names; OPT's ffn_dim; GPT-Neo's num_layers /
    num_heads); heads as stated."""
    if cfg.get("model_type") == "gpt_neo":
        out = {**_NEO, **cfg}
        heads, hidden = out["num_heads"], out["hidden_size"]
        return {
            **out,
            "num_hidden_layers": out["num_layers"],
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": hidden // heads,
            "intermediate_size": out.get("intermediate_size") or 4 * hidden,
        }
    if cfg.get("model_type") == "opt":
        out = {**_OPT, **cfg}
        heads = out["num_attention_heads"]
        return {
            **out,
            "intermediate_size": out["ffn_dim"],
            "num_key_value_heads": heads,
            "max_position_embeddings": out.get("max_position_embeddings", 2048),
            "head_dim": out["hidden_size"] // heads,
        }
    out = {**_GPT2, **cfg}
    for key, short in _GPT2_KEYS.items():
        if short in cfg:
            out[key] = cfg[short]
    out.setdefault("max_position_embeddings", 1024)
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    multi_query = out["model_type"] == "gpt_bigcode" and out.get("multi_query", True)
    return {
        **out,
        "num_key_value_heads": 1 if multi_query else heads,
        "head_dim": hidden // heads,
        "intermediate_size": out.get("n_inner") or 4 * hidden,  # (GPT-2 has no intermediate_size key)
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern does not compute."""
    if model_type not in ("gpt2", "gpt_bigcode", "opt", "gpt_neo"):
        raise UnsupportedModelError(f"family_gpt2 does not configure model_type {model_type!r}")
    if model_type == "gpt_neo":
        return _configure_neo(cfg, fields)
    opt = model_type == "opt"
    act = cfg.get("activation_function", "relu" if opt else "gelu_new" if model_type == "gpt2" else "gelu_pytorch_tanh")
    acts = _ACTS_OPT if opt else _ACTS
    if act not in acts:
        raise refuse("activation_function", act, f"; supported: {', '.join(acts)}")
    if opt:
        _check_opt(cfg)
    elif cfg.get("scale_attn_by_inverse_layer_idx"):
        raise refuse("scale_attn_by_inverse_layer_idx", True, " (attention scores scaled per layer)")
    head_type = cfg.get("attention_head_type")
    if head_type not in (None, "multihead"):  # bigcode/santacoder's own code (q_attn / kv_attn), under gpt2
        raise refuse("attention_head_type", head_type, " (SantaCoder's remote code; its GPT-BigCode conversion loads)")
    if cfg.get("add_cross_attention"):
        raise refuse("add_cross_attention", True, " (a decoder reading an encoder)")
    bias = bool(cfg.get("enable_bias", True)) if opt else True
    scaled = opt or cfg.get("scale_attn_weights", True)
    return {
        "hidden_act": acts[act],
        "rms_norm_eps": 1e-5 if opt else float(cfg.get("layer_norm_epsilon", 1e-5)),  # (OPT: nn.LayerNorm's)
        "attention_bias": bias,
        "mlp_bias": bias,
        "learned_positions": True,
        "rope_layers": (False,) * fields["num_layers"],
        "rope_scaling": None,
        "attn_scale": None if scaled else 1.0,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),  # (the three configs' default)
    }


def _configure_neo(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACTS:
        raise refuse("activation_function", act, f"; supported: {', '.join(_ACTS)}")
    layers = fields["num_layers"]
    types = cfg.get("attention_types") or [[["global", "local"], 12]]
    try:
        kinds = [kind for pattern, repeat in types for _ in range(int(repeat)) for kind in pattern]
    except (TypeError, ValueError):
        raise refuse("attention_types", types, " (a list of [[layer types], repeats])") from None
    if len(kinds) != layers or set(kinds) - {"global", "local"}:
        raise refuse("attention_types", types, f" (global or local for each of the {layers} layers)")
    window = int(cfg.get("window_size", 256))
    return {
        "hidden_act": _ACTS[act],
        "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
        "attention_bias": False,
        "attn_out_bias": True,
        "mlp_bias": True,
        "learned_positions": True,
        "rope_layers": (False,) * layers,
        "rope_scaling": None,
        "attn_scale": 1.0,
        "layer_windows": [window if kind == "local" else None for kind in kinds] if "local" in kinds else None,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


def _check_opt(cfg: dict[str, Any]) -> None:
    if not cfg.get("do_layer_norm_before", True):
        raise refuse("do_layer_norm_before", False, " (post-norm layers: OPT-350m)")
    if cfg.get("_remove_final_layer_norm"):
        raise refuse("_remove_final_layer_norm", True, "")
    if not cfg.get("layer_norm_elementwise_affine", True):
        raise refuse("layer_norm_elementwise_affine", False, " (LayerNorms without weights)")
    proj = cfg.get("word_embed_proj_dim")
    if proj is not None and proj != cfg["hidden_size"]:
        raise refuse("word_embed_proj_dim", proj, f" (embeddings projected to hidden_size {cfg['hidden_size']})")


_GPT2_LAYER = {
    "ln_1": "input_layernorm",
    "attn.c_attn": "self_attn.qkv_proj",
    "attn.c_proj": "self_attn.o_proj",
    "ln_2": "post_attention_layernorm",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
    # GPT-Neo's
    **{f"attn.attention.{p}_proj": f"self_attn.{p}_proj" for p in ("q", "k", "v")},
    "attn.attention.out_proj": "self_attn.o_proj",
}
_GPT2_GLOBAL = {"wte": "model.embed_tokens", "wpe": "model.embed_positions", "ln_f": "model.norm"}
_OPT_LAYER = {
    "self_attn_layer_norm": "input_layernorm",
    "self_attn.out_proj": "self_attn.o_proj",
    "final_layer_norm": "post_attention_layernorm",
    "fc1": "mlp.up_proj",
    "fc2": "mlp.down_proj",
}
_OPT_GLOBAL = {"embed_tokens": "model.embed_tokens", "embed_positions": "model.embed_positions"}
_OPT_GLOBAL["final_layer_norm"] = "model.norm"
# (any last part: weight and bias, and a quantized module's tensors alike)
_GPT2_RE = re.compile(r"^(?:transformer\.|model\.)?(?:h\.(\d+)\.)?([a-z_0-9.]+)\.([a-z_]+)$")
_OPT_RE = re.compile(r"^(?:model\.)?decoder\.(?:layers\.(\d+)\.)?([a-z_0-9.]+)\.([a-z_]+)$")


def checkpoint_name(name: str) -> str | None:
    """A GPT-2 / GPT-BigCode / OPT checkpoint's tensor under the model files' name; None for what is not loaded
    (GPT-2's stored attention masks, attn.bias / attn.masked_bias). An unknown name is kept: the model files then
    refuse it by name."""
    if name == "lm_head.weight":
        return name
    opt = _OPT_RE.match(name)
    if opt is not None:
        layer, part, kind = opt.groups()
        table = _OPT_GLOBAL if layer is None else _OPT_LAYER
        mapped = table.get(part, part)  # (q_proj / k_proj / v_proj as they are)
        return f"{mapped}.{kind}" if layer is None else f"model.layers.{layer}.{mapped}.{kind}"
    m = _GPT2_RE.match(name)
    if m is None:
        return name
    layer, part, kind = m.groups()
    if layer is None:
        return f"{_GPT2_GLOBAL[part]}.{kind}" if part in _GPT2_GLOBAL else name
    if part in ("attn", "attn.attention"):  # (GPT-Neo's) attn.bias / attn.masked_bias: mask buffers, not weights
        return None
    mapped = _GPT2_LAYER.get(part)
    return name if mapped is None else f"model.layers.{layer}.{mapped}.{kind}"  # (unknown: refused by name)


_CONV1D = (".self_attn.qkv_proj.weight", ".self_attn.o_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight")


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream in the model files' layout: GPT-2's Conv1D matrices transposed (a Hugging Face folder's; GGUF
    files and mlx_lm's folders hold them as nn.Linear), GPT-BigCode's per-head q/k/v reordered, OPT's two unused
    position rows dropped, the position table in float."""
    cfg = spec.config
    conv1d = cfg.architecture == "gpt2" and spec.weight_format != "gguf" and not _saved_by_mlx_lm(spec)
    per_head = cfg.architecture == "gpt_bigcode" and 1 < cfg.num_kv_heads and spec.weight_format != "gguf"
    order = stacked_order(cfg.num_heads, 1, cfg.head_dim) if per_head else None
    for name, value in source:
        if conv1d and name.endswith(_CONV1D):
            if not hasattr(value, "ndim"):  # (a quantized Conv1D matrix cannot be transposed in its blocks)
                raise UnsupportedModelError(f"{name}: a quantized GPT-2 Conv1D matrix ({type(value).__name__})")
            value = value.transpose(1, 0)
        if order is not None and ".self_attn.qkv_proj." in name:
            value = reorder_rows(value, order)
        if name == "model.embed_positions.weight":
            value = _float_table(value)
            if cfg.architecture == "opt":  # OPTLearnedPositionalEmbedding: position p reads row p + 2
                value = value[2:]
        yield name, value


def _float_table(value: Any) -> Any:
    from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
    from lantern.app.models.quant.microscaled import MxWeight
    from lantern.app.models.quant.mlx_packed import MlxPacked

    return value.dequantize() if isinstance(value, (AffineWeight, Fp8Weight, MxWeight, MlxPacked)) else value


def _saved_by_mlx_lm(spec: Any) -> bool:
    """mlx_lm's GPT-2 saves its transposed (nn.Linear) matrices under "model."-prefixed names."""
    from lantern.app.models.weight_stream import RawSafetensors

    for path in spec.weight_files:
        raw = RawSafetensors(path)
        names = raw.names
        raw.close()
        if any(n.startswith("model.h.") for n in names):
            return True
    return False
