"""OLMo Hybrid (model_type "olmo_hybrid": allenai/Olmo-Hybrid-7B): what its config.json means, as transformers'
OlmoHybridConfig reads it (defaults included), turned into ModelConfig fields.

The maths (transformers' modeling_olmo_hybrid): layers of two kinds (layer_types; by default every fourth full):
- full attention: OLMo 3's layer -- no norm before the sublayers, each sublayer's output RMS-normed before the residual
  add, q/k RMSNorms over whole projections, a rope unless rope_theta is null (NoPE then, on every layer);
- linear attention: Llama's pre-norm layer around Qwen3.5's gated delta net with its q, k, v, a, b and output gate
  (g_proj) as separate projections, beta = 2 * sigmoid(b) where linear_allow_neg_eigval (the default), its gated
  output norm at eps 1e-5; plain RMSNorms (weight times the normed input) everywhere.

The linear layers run on family_qwen3_next's state and kernels (LinearAttnConfig); the model files are
backends/*/models/olmo_hybrid.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import check_attention_types, check_silu, refuse
from lantern.app.models.family_qwen3_next import LinearAttnConfig, join_qkv_convs
from lantern.app.models.spec import UnsupportedModelError

# OlmoHybridConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 100352,
    "hidden_size": 3840,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 30,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 100277,
    "eos_token_id": 100257,
}
# The released checkpoints' names (transformers' conversion mapping renames them the same way while loading): each
# layer's first norm is attention_layer_norm, its second feedforward_layer_norm (the linear layers' pre-norms, the
# attention layers' norm after attention), the convolution comes as three (q, k, v: joined by checkpoint_tensors).
_NORMS = (
    (re.compile(r"\.attention_layer_norm\."), ".input_layernorm."),
    (re.compile(r"\.feedforward_layer_norm\."), ".post_attention_layernorm."),
)
# The gated delta net's tensors under Qwen3.5's names (the model files'): q/k/v stay apart (each backend joins them)
_LINEAR_NAMES = {
    "g_proj": "in_proj_z",
    "a_proj": "in_proj_a",
    "b_proj": "in_proj_b",
    "o_proj": "out_proj",
    "o_norm": "norm",
}
_LINEAR_RE = re.compile(r"\.linear_attn\.(g_proj|a_proj|b_proj|o_proj|o_norm)\.")
_CONV_RE = re.compile(r"^(.*\.linear_attn\.)([qkv])_conv1d\.weight$")


def checkpoint_name(name: str) -> str:
    """An OLMo Hybrid checkpoint's tensor under the model files' name."""
    for pattern, new in _NORMS:
        name = pattern.sub(new, name)
    return _LINEAR_RE.sub(lambda m: f".linear_attn.{_LINEAR_NAMES[m.group(1)]}.", name)


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each layer's q, k and v convolution kernels joined into conv1d's (family_qwen3_next)."""
    return join_qkv_convs(source, "linear_attn", "olmo_hybrid")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an olmo_hybrid config; refuses, naming the key, what it does not compute."""
    if model_type != "olmo_hybrid":
        raise UnsupportedModelError(f"family_olmo_hybrid does not configure model_type {model_type!r}")
    check_silu(cfg, "OLMo Hybrid")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for olmo_hybrid")
    heads, hidden, layers = fields["num_heads"], fields["hidden_size"], fields["num_layers"]
    if cfg.get("head_dim") not in (None, hidden // heads):  # (OlmoHybridConfig has none: hidden / heads)
        raise refuse(
            "head_dim", cfg["head_dim"], f" for olmo_hybrid (its heads are hidden_size / heads = {hidden // heads})"
        )
    types = cfg.get("layer_types") or [
        "full_attention" if i % 4 == 3 or (layers < 4 and i == layers - 1) else "linear_attention"
        for i in range(layers)
    ]
    check_attention_types(types, layers, allowed=("full_attention", "linear_attention"))
    if "full_attention" not in types or "linear_attention" not in types:
        raise refuse("layer_types", types, " (OLMo Hybrid has both linear and full attention layers)")
    nk = int(cfg.get("linear_num_key_heads") or heads)
    nv = int(cfg.get("linear_num_value_heads") or heads)
    dk = int(cfg.get("linear_key_head_dim") or int(0.75 * hidden / nk))
    dv = int(cfg.get("linear_value_head_dim") or 2 * dk)
    if nv % nk:
        raise refuse("linear_num_value_heads", nv, " (must be a multiple of linear_num_key_heads)")
    linear = LinearAttnConfig(
        linear_layers=tuple(t == "linear_attention" for t in types),
        num_k_heads=nk,
        num_v_heads=nv,
        k_dim=dk,
        v_dim=dv,
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        fused_qkvz=False,
        fused_ba=False,
        beta_scale=2.0 if cfg.get("linear_allow_neg_eigval", True) else 1.0,
        norm_eps=1e-5,
    )
    rope = cfg.get("rope_parameters") or {}
    theta = rope["rope_theta"] if "rope_theta" in rope else cfg.get("rope_theta", 10000.0)
    out: dict[str, Any] = {"linear_attn": linear, "qk_norm": False, "head_dim": hidden // heads}
    if theta is None:  # (no rotary embedding at all: transformers' rotary_emb is None)
        out.update(rope_layers=(False,) * layers, rope_scaling=None)
    return out
