"""Lara Mini (model_type "lara_mini": translated/Lara-4-Mini), as transformers' LaraMiniConfig reads its config.json,
turned into ModelConfig fields; its checkpoint's tensors under the model files' names.

The maths (transformers' modeling_lara_mini): a hybrid of Qwen3.5's gated delta net layers (family_qwen3_next's
rule and state slots; q/k/v, z, b and a apart, the gated output norm scaling by its weight), Qwen3's attention with
per-head q/k norms on the other layers -- sliding ones (a window of sliding_window keys) rotated by the rope, full
ones without any rope -- and a mixture in every layer: a float32 softmax router's top-k (renormalised where
norm_topk_prob says), plus one shared expert added ungated (DeepSeek's shape: DeepSeekMoEConfig). RMSNorms scale
by their weight. The released checkpoints fuse the delta net's input projections into `in_proj` (rows q | k | v | z |
b | a) and call its norm `out_norm`: split and renamed while loading, as transformers' conversion mapping does. Its
norms apply their weight in float32 and round once (the model files' Fp32RMSNorm, GatedNorm's fp32).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.family_qwen3_next import LinearAttnConfig
from lantern.app.models.spec import UnsupportedModelError

# LaraMiniConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults"); its MLPs are all
# mixtures, so intermediate_size (which it has not) is never used.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 512,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 151643,
}
_PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")
_KINDS = ("linear_attention", "sliding_attention", "full_attention")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a lara_mini config; refuses, naming the key, what it does not compute."""
    if model_type != "lara_mini":
        raise UnsupportedModelError(f"family_lara_mini does not configure model_type {model_type!r}")
    check_silu(cfg, "Lara Mini")
    if cfg.get("attention_bias"):
        raise refuse("attention_bias", cfg["attention_bias"], " for lara_mini")
    layers = int(fields["num_layers"])
    types = cfg.get("layer_types") or [_PATTERN[i % len(_PATTERN)] for i in range(layers)]
    if len(types) != layers or set(types) - set(_KINDS):
        raise refuse("layer_types", types, f" ({' / '.join(_KINDS)} for each of {layers} layers)")
    if "linear_attention" not in types or types.count("linear_attention") == layers:
        raise refuse("layer_types", types, " (gated delta net layers beside attention ones)")
    linear = LinearAttnConfig(
        linear_layers=tuple(t == "linear_attention" for t in types),
        num_k_heads=int(cfg.get("linear_num_key_heads", 8)),
        num_v_heads=int(cfg.get("linear_num_value_heads", 16)),
        k_dim=int(cfg.get("linear_key_head_dim", 128)),
        v_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        fused_qkvz=False,
        fused_ba=False,
        norm_fp32=True,
    )
    if linear.num_v_heads % linear.num_k_heads:
        raise refuse("linear_num_value_heads", linear.num_v_heads, " (a multiple of linear_num_key_heads)")
    if linear.conv_kernel < 2:
        raise refuse("linear_conv_kernel_dim", linear.conv_kernel, " (must be at least 2)")
    experts, top_k = int(cfg.get("num_experts", 128)), int(cfg.get("num_experts_per_tok", 4))
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", top_k, f" (between 1 and the {experts} experts)")
    window = int(cfg.get("sliding_window", 512))
    return {
        "linear_attn": linear,
        "qk_norm": True,
        "layer_windows": [window if t == "sliding_attention" else None for t in types],
        "rope_layers": tuple(t == "sliding_attention" for t in types),  # (full layers: NoPE)
        "moe": DeepSeekMoEConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=int(cfg.get("moe_intermediate_size", 512)),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            scoring="softmax",
            topk_method="greedy",
            shared_size=int(cfg.get("shared_expert_intermediate_size", 512)),
            router_fp32=False,  # (the router's logits in float32 from the weight as the model holds it)
            norm_eps=0.0,
        ),
    }


def checkpoint_name(name: str) -> str | None:
    """The model files' name of a Lara Mini tensor: the delta net's out_norm as norm, the shared expert under
    DeepSeek's shared_experts (the fused in_proj is split by checkpoint_tensors)."""
    return name.replace(".linear_attn.out_norm.", ".linear_attn.norm.").replace(
        ".mlp.shared_expert.", ".mlp.shared_experts."
    )


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each delta net's fused in_proj [q | k | v | z | b | a] as in_proj_qkv / z / b / a (row
    slices: a quantized checkpoint stays quantized)."""
    from lantern.app.models.weight_stream import _row_slice

    la = spec.config.linear_attn
    key, value, heads = la.num_k_heads * la.k_dim, la.num_v_heads * la.v_dim, la.num_v_heads
    parts = (("in_proj_qkv", 2 * key + value), ("in_proj_z", value), ("in_proj_b", heads), ("in_proj_a", heads))
    for name, tensor in source:
        stem, _, kind = name.rpartition(".")
        if not stem.endswith(".linear_attn.in_proj"):
            yield name, tensor
            continue
        start, base = 0, stem.removesuffix("in_proj")
        for part, rows in parts:
            yield f"{base}{part}.{kind}", _row_slice(tensor, start, start + rows)
            start += rows
