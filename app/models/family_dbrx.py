"""DBRX (model_type "dbrx": databricks/dbrx-base / dbrx-instruct), as transformers' DbrxConfig reads its config.json
(defaults included, the attention's and FFN's keys nested in attn_config / ffn_config), turned into ModelConfig
fields; its checkpoint's names and fused experts in the model files' terms.

The maths (transformers' modeling_dbrx): Llama's pre-norm layer under LayerNorms with a weight only (norm_1,
norm_2, norm_f; eps 1e-5), q/k/v in one Wqkv clamped to [-clip_qkv, clip_qkv], the rope on the two halves of each
head, and every MLP a mixture: a softmax over all experts (the router's `layer`), the top moe_top_k kept and
divided by their sum (moe_normalize_expert_weights 1; none: as they are), SiLU-gated experts ffn_hidden_size wide.

The rope base: DBRX states it as attn_config.rope_theta (500000 in the releases), which its own code and
llama.cpp's converter read; transformers' DbrxConfig ignores that key (its rope then turns at 10000), so Lantern
reads it (a top-level rope_parameters, where a config has one, wins).

Checkpoint layout: each layer's experts in three 2-D tensors without a .weight suffix, ffn.experts.mlp.w1 / v1 / w2,
[experts * ffn_hidden_size, d_model] each (w2 as each expert's down projection transposed): split into per-expert
gate / up / down projections while loading. mlx_lm's conversions store them per expert (ffn.experts.<e>.w1 ... in
nn.Linear layout, quantized or not). llama.cpp's `dbrx` GGUFs are read by gguf_builders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.family_moe import MoEConfig

# DbrxConfig's (and its sub-configs') defaults
_TOP = {"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048, "vocab_size": 32000}
_ATTN = {"kv_n_heads": 1, "clip_qkv": None, "rope_theta": 10000.0}
_FFN = {"ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1, "moe_normalize_expert_weights": 1.0}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads."""
    top = {**_TOP, **cfg}
    attn = {**_ATTN, **(cfg.get("attn_config") or {})}
    ffn = {**_FFN, **(cfg.get("ffn_config") or {})}
    rope = dict(cfg.get("rope_parameters") or {})
    rope.setdefault("rope_theta", attn["rope_theta"] or _ATTN["rope_theta"])
    rope.setdefault("rope_type", "default")
    return {
        **top,
        "hidden_size": top["d_model"],
        "num_hidden_layers": top["n_layers"],
        "num_attention_heads": top["n_heads"],
        "num_key_value_heads": attn["kv_n_heads"],
        "max_position_embeddings": top["max_seq_len"],
        "intermediate_size": ffn["ffn_hidden_size"],
        "rope_parameters": rope,
        "rms_norm_eps": 1e-5,  # (nn.LayerNorm's)
        "attn_config": attn,
        "ffn_config": ffn,
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a dbrx config; refuses, naming the key, what it does not compute."""
    if model_type != "dbrx":
        raise UnsupportedModelError(f"family_dbrx does not configure model_type {model_type!r}")
    attn, ffn = cfg["attn_config"], cfg["ffn_config"]
    act = (ffn.get("ffn_act_fn") or {"name": "silu"}).get("name")
    if act != "silu":
        raise refuse("ffn_config.ffn_act_fn.name", act, " for dbrx (SiLU-gated experts)")
    if cfg.get("tie_word_embeddings"):  # (DbrxConfig refuses it too)
        raise refuse("tie_word_embeddings", True, " for dbrx")
    norm = ffn["moe_normalize_expert_weights"]
    if norm is not None and float(norm) != 1.0:
        raise refuse("ffn_config.moe_normalize_expert_weights", norm, " (the top-k weights over their p-norm: p = 1)")
    experts, top_k = int(ffn["moe_num_experts"]), int(ffn["moe_top_k"])
    if not 1 <= top_k <= experts:
        raise refuse("ffn_config.moe_top_k", top_k, f" (must be between 1 and the {experts} experts)")
    clip = attn.get("clip_qkv")
    return {
        "clip_qkv": float(clip) if clip else None,
        "moe": MoEConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=int(ffn["ffn_hidden_size"]),
            norm_topk_prob=norm is not None,
        ),
    }


_LAYER = {
    "norm_attn_norm.norm_1": "input_layernorm",
    "norm_attn_norm.norm_2": "post_attention_layernorm",
    "norm_attn_norm.attn.Wqkv": "self_attn.qkv_proj",
    "norm_attn_norm.attn.out_proj": "self_attn.o_proj",
    "ffn.router.layer": "mlp.gate",
}
_EXPERT_PROJ = {"w1": "gate_proj", "v1": "up_proj", "w2": "down_proj"}
_BLOCK = re.compile(r"^transformer\.blocks\.(\d+)\.(.+)\.([A-Za-z_]+)$")
_FUSED = re.compile(r"^transformer\.blocks\.(\d+)\.ffn\.experts\.mlp\.(w1|v1|w2)$")
_PER_EXPERT = re.compile(r"^transformer\.blocks\.(\d+)\.ffn\.experts\.(\d+)\.(w1|v1|w2)\.([a-z_]+)$")
_GLOBAL = {"transformer.wte.weight": "model.embed_tokens.weight", "transformer.norm_f.weight": "model.norm.weight"}


def checkpoint_name(name: str) -> str | None:
    """A DBRX checkpoint's tensor under the model files' name (its fused experts as <layer>.mlp.experts.<w1|v1|w2>,
    split by checkpoint_tensors); an unknown name is kept, for the model files to refuse by name."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    fused = _FUSED.match(name)
    if fused is not None:
        return f"model.layers.{fused.group(1)}.mlp.experts.{fused.group(2)}"
    expert = _PER_EXPERT.match(name)
    if expert is not None:
        layer, e, proj, kind = expert.groups()
        return f"model.layers.{layer}.mlp.experts.{e}.{_EXPERT_PROJ[proj]}.{kind}"
    m = _BLOCK.match(name)
    if m is not None and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each layer's fused experts as per-expert projections in nn.Linear layout."""
    cfg = spec.config
    experts, width = cfg.moe.num_experts, cfg.moe.intermediate_size
    for name, value in source:
        stem, _, proj = name.rpartition(".")
        if not (stem.endswith(".mlp.experts") and proj in _EXPERT_PROJ):
            yield name, value
            continue
        if not hasattr(value, "ndim"):  # (a quantized fused tensor: its w2 would need its blocks transposed)
            raise UnsupportedModelError(f"{name}: DBRX's fused experts quantized ({type(value).__name__})")
        if tuple(value.shape) != (experts * width, cfg.hidden_size):
            want = (experts * width, cfg.hidden_size)
            raise ValueError(f"{name} has shape {tuple(value.shape)}; the config implies {want}")
        for e in range(experts):
            part = value[e * width : (e + 1) * width]
            yield f"{stem}.{e}.{_EXPERT_PROJ[proj]}.weight", part.transpose(1, 0) if proj == "w2" else part
