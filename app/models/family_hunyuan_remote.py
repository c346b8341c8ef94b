"""Tencent's remote-code Hunyuan folders (model_type "hunyuan": Hunyuan-A13B-Instruct / -Pretrain as first released,
Hunyuan-7B-Instruct-0124 and the Hunyuan-Large family), read as the transformers classes that took their maths:
HunYuanMoEV1 where the config has experts, HunYuanDenseV1 where it has one (family_hunyuan computes both).

- Config (their configuration_hunyuan.HunYuanConfig): its defaults differ from transformers' (no q/k norms, an
  untied head, no shared MLP unless stated); `attention_head_dim` is head_dim. What its code computes and Lantern
  does not is refused by key: cross-layer attention (use_cla, Hunyuan-Large), latent attention, Mamba layers,
  dense layers before the mixture, grouped routing, a routed scale, token dropping, XD-RoPE, a classifier head.
- Routing: its topkgating divides the chosen experts' softmax weights by their sum at every top-k (top-1 too),
  as transformers' HunYuanMoEV1 does (its training-time expert capacity is not applied at inference here, nor in
  transformers).
- Tensors: some checkpoints store q/k/v as one `qkv_proj` grouped by KV head ([queries of the group, its key, its
  value] per KV head, as mlx_lm's hunyuan splits it) and an MLP's two inputs as one `gate_and_up_proj` whose first
  half is the up projection and second the gate (the remote MLP computes down(x1 * silu(x2))); both are cut into
  the separate projections here (row permutations and slices: a quantized checkpoint stays quantized).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import refuse

# HunYuanConfig's defaults where the transformers classes' differ (the keys a released config always states, the
# shape, have none that matter)
DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "use_qk_norm": False,
    "num_experts": 1,
    "moe_topk": 1,
    "num_shared_expert": 1,
    "use_mixed_mlp_moe": False,
    "rope_theta": 10000.0,
}

# keys whose non-default value HunYuanConfig's code computes and Lantern does not: (key, its default)
_REFUSED = (
    ("use_cla", False),
    ("use_mla", False),
    ("mamba", False),
    ("moe_layer_num_skipped", 0),
    ("group_limited_greedy", False),
    ("routed_scaling_factor", 1.0),
    ("moe_drop_tokens", False),
    ("position_embedding_xdrope", False),
    ("add_classification_head", False),
    ("use_rotary_pos_emb", True),
    ("mlp_bias", False),
)


def transformers_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A `hunyuan` config.json as the transformers class's (hunyuan_v1_moe or hunyuan_v1_dense) config.json."""
    out = {**DEFAULTS, **cfg}
    for key, default in _REFUSED:
        if out.get(key, default) not in (default, None):
            raise refuse(key, out[key], " (Tencent's Hunyuan remote code computes it; Lantern does not)")
    if out.get("norm_type", "hf_rms") not in ("hf_rms", "rms"):
        raise refuse("norm_type", out["norm_type"], " (RMSNorm only)")
    if not out.pop("use_qk_norm"):  # (every released Hunyuan norms them: the transformers classes always do)
        raise refuse("use_qk_norm", False, " (Hunyuan's per-head q/k norms are computed unconditionally)")
    if out.get("attention_head_dim") is not None:
        stated = out.get("head_dim")
        if stated is not None and stated != out["attention_head_dim"]:
            raise refuse("attention_head_dim", out["attention_head_dim"], f" beside head_dim={stated}")
        out["head_dim"] = out.pop("attention_head_dim")
    experts = out["num_experts"]
    counts = set(experts) if isinstance(experts, list) else {experts}
    dense = "HunYuanDenseV1ForCausalLM" in (out.get("architectures") or []) or counts == {1}
    if dense:
        if counts != {1}:
            raise refuse("num_experts", experts, " in a HunYuanDenseV1ForCausalLM folder")
        for key in ("num_experts", "moe_topk", "num_shared_expert", "use_mixed_mlp_moe", "moe_intermediate_size"):
            out.pop(key, None)
    return {**out, "model_type": "hunyuan_v1_dense" if dense else "hunyuan_v1_moe"}


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with fused `qkv_proj` (grouped by KV head) regrouped to q, k, v rows and split as
    weight_stream.split_fused splits any (as InternLM2's), and `gate_and_up_proj` ([up | gate], in expert and shared
    MLPs too) cut into its two projections; everything else as is."""
    from lantern.app.models.grouped_qkv import reorder_rows, stacked_order
    from lantern.app.models.weight_stream import _row_slice, split_fused

    cfg = spec.config
    order = stacked_order(cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim)

    def regrouped() -> Iterator[tuple[str, Any]]:
        for name, value in source:
            module, _, kind = name.rpartition(".")
            stem, _, fused = module.rpartition(".")
            if fused == "qkv_proj":
                yield name, reorder_rows(value, order)
            elif fused == "gate_and_up_proj":
                half = value.shape[0] // 2
                yield f"{stem}.up_proj.{kind}", _row_slice(value, 0, half)
                yield f"{stem}.gate_proj.{kind}", _row_slice(value, half, 2 * half)
            else:
                yield name, value

    return split_fused(regrouped(), spec)


def checkpoint_name(name: str) -> str:
    """Its tensors' names as the model files': the transformers classes' (family_hunyuan.checkpoint_name)."""
    from lantern.app.models.family_hunyuan import checkpoint_name as transformers_name

    return transformers_name(name)
