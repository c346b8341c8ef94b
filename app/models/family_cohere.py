"""Cohere Command R7B / Command A (model_type "cohere2") and Command R / R+ / Aya 23 / Aya Expanse ("cohere"):
what their config.json means, as transformers' Cohere2Config / CohereConfig read it, turned into ModelConfig
fields.

The maths (transformers' modeling_cohere2): one LayerNorm per layer (mean-subtracted, weight only, in
float32) whose output feeds attention and MLP in parallel, both added to the residual stream; the rope
rotates consecutive pairs of each head and only on the sliding layers (layer_types; default three
sliding, then one global, window 4096) — the global layers apply no rope; logits times logit_scale;
embeddings tied by default. attention_bias would add biases to q/k/v and o_proj (refused: the released
models have none). The first generation ("cohere") is the same block with the rope on every layer, and
Command R+'s use_qk_norm: a LayerNorm over each head of q and k (a weight per head) before the rope.

Cohere2-MoE ("cohere2_moe", Cohere2MoeConfig): Command A's block with a mixture where mlp_layer_types says
"sparse" (by default past first_k_dense_replace dense layers, prefix_dense_intermediate_size wide): Mixtral's
experts (intermediate_size wide) chosen by the router's top-k logits, weighted by a softmax over those (or
their sigmoids, renormalised with norm_topk_prob), beside num_shared_experts' MLP, the two summed or averaged
(shared_expert_combination_strategy). The dense prefix has its own sliding pattern; a dense layer with
prefix_dense_sliding_window_pattern 1 (every prefix layer global) turns the rope all the same. DeepSeek's
mixture computes this routing (family_deepseek.DeepSeekMoEConfig: softmax of all then top-k renormalised is the
softmax of the top k). With rms_norm_eps set its norms are RMSNorms (ModelConfig.rms_norm); its multi-token-
prediction layers (num_nextn_predict_layers, stored after the stack) are skipped.

Cohere Compass ("cohere_compass_text": the language model of CohereLabs/North-*-Vision, CohereCompassTextConfig):
Command A's block whose rope turns the two halves of each head (Qwen3's rotate_half, not Cohere's pairs), each
layer type on its own rope (rope_parameters by type; null: NoPE) -- its M-RoPE sections collapse to the plain rope
on text, whose three position axes are equal --, head_dim hidden_size / heads, every layer full unless layer_types
says, logits times logit_scale where stated (1 otherwise).
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError, check_attention_types, check_silu
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a cohere, cohere2 or cohere2_moe config.json (spec.ModelConfig.from_hf skips its
    Llama-family checks for configure families: the keys are checked here)."""
    if model_type not in ("cohere", "cohere2", "cohere2_moe", "cohere_compass_text"):
        raise UnsupportedModelError(f"family_cohere does not configure model_type {model_type!r}")
    check_silu(cfg, "Cohere")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], f" for {model_type} (biases on q/k/v and o_proj)")
    if cfg.get("rotary_pct", 1.0) not in (None, 1, 1.0):  # transformers ignores it, llama.cpp honours it
        raise _refuse("rotary_pct", cfg["rotary_pct"], " (a partial rope: transformers and llama.cpp disagree)")
    if model_type == "cohere":  # (trained on 128k positions, model_max_length says; max_position_embeddings 8192)
        context = int(cfg.get("model_max_length") or cfg.get("max_position_embeddings", 8192))
        return {
            **_common(cfg, fields),
            "qk_norm": bool(cfg.get("use_qk_norm", False)),
            "max_position_embeddings": context,
        }
    if model_type == "cohere_compass_text":
        return _compass(cfg, fields)
    num_layers = fields["num_layers"]
    moe = model_type == "cohere2_moe"
    first_dense = int(cfg.get("first_k_dense_replace") or 0) if moe else 0
    types = cfg.get("layer_types")
    if types is None:  # (Cohere2MoeConfig: the dense prefix on its own pattern)
        prefix = _pattern(cfg, "prefix_dense_sliding_window_pattern", 1) if moe else 1
        pattern = _pattern(cfg, "sliding_window_pattern", 4)
        types = [_kind(i, prefix) for i in range(first_dense)]
        types += [_kind(i, pattern) for i in range(num_layers - first_dense)]
    check_attention_types(types, num_layers)
    sliding = [t == "sliding_attention" for t in types]
    window = cfg.get("sliding_window", 4096)
    if any(sliding) and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    out = {
        **_common(cfg, fields),
        "layer_windows": [int(window) if s else None for s in sliding] if any(sliding) else None,
        "rope_layers": None if all(sliding) else tuple(sliding),  # the global layers are NoPE
    }
    if moe:
        out.update(_mixture(cfg, fields, first_dense, sliding))
    return out


def _compass(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    layers = fields["num_layers"]
    types = cfg.get("layer_types") or ["full_attention"] * layers
    check_attention_types(types, layers)
    params = cfg.get("rope_parameters") or {}
    thetas = {}
    for kind in dict.fromkeys(types):
        if kind not in params:
            raise _refuse("rope_parameters", params, f" (a rope, or null, for the {kind} layers)")
        rope = params[kind]
        if rope is not None and (rope.get("rope_type") or "default") != "default":
            raise _refuse(f"rope_parameters.{kind}.rope_type", rope["rope_type"], " (a plain rope)")
        if rope is not None:
            thetas[kind] = float(rope.get("rope_theta", 10000.0))
    if len(set(thetas.values())) > 1:  # (the family's one rope table)
        raise _refuse("rope_parameters", params, " (the layer types' ropes on different bases)")
    sliding = [t == "sliding_attention" for t in types]
    window = cfg.get("sliding_window", 4096)
    if any(sliding) and not window:
        raise _refuse("sliding_window", window, " with sliding_attention layers")
    rotates = tuple(t in thetas for t in types)
    scale = cfg.get("logit_scale")
    return {
        **_common({**cfg, "logit_scale": 1.0 if scale is None else scale}, fields),
        "head_dim": fields["hidden_size"] // fields["num_heads"],  # (CohereCompassTextConfig sets it so)
        "rope_interleaved": False,
        "rope_theta": next(iter(thetas.values()), fields["rope_theta"]),
        "rope_layers": None if all(rotates) else rotates,
        "layer_windows": [int(window) if s else None for s in sliding] if any(sliding) else None,
    }


def _pattern(cfg: dict[str, Any], key: str, default: int) -> int:
    pattern = cfg.get(key, default)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
        raise _refuse(key, pattern, " (a positive layer count)")
    return pattern


def _kind(i: int, pattern: int) -> str:
    return "sliding_attention" if (i + 1) % pattern else "full_attention"


def _mixture(cfg: dict[str, Any], fields: dict[str, Any], first_dense: int, sliding: list[bool]) -> dict[str, Any]:
    """Cohere2-MoE's fields: its experts, the dense layers' width, the rope its dense global layers force."""
    layers = fields["num_layers"]
    kinds = cfg.get("mlp_layer_types") or ["dense" if i < first_dense else "sparse" for i in range(layers)]
    if len(kinds) != layers or set(kinds) - {"dense", "sparse"}:
        raise _refuse("mlp_layer_types", kinds, f" (dense or sparse for each of the {layers} layers)")
    selection = cfg.get("expert_selection_fn", "softmax")
    if selection not in ("softmax", "sigmoid"):
        raise _refuse("expert_selection_fn", selection, " (softmax or sigmoid)")
    combine = cfg.get("shared_expert_combination_strategy", "average")
    if combine not in ("sum", "average"):
        raise _refuse("shared_expert_combination_strategy", combine, " (sum or average)")
    experts, top_k = int(cfg.get("num_experts", 8)), int(cfg.get("num_experts_per_tok", 2))
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    width = fields["intermediate_size"]
    dense_width = cfg.get("prefix_dense_intermediate_size") or width
    shared = int(cfg.get("num_shared_experts") or 0) * width
    moe = DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=width,
        # the softmax of the top k logits, or their sigmoids (renormalised only with norm_topk_prob)
        norm_topk_prob=selection == "softmax" or bool(cfg.get("norm_topk_prob", True)),
        router_weights_fp32=False,  # (cast to the activations' dtype before the experts are weighted)
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        scoring=selection,
        shared_size=shared,
        shared_average=bool(shared) and combine == "average",
        norm_eps=0.0,
    )
    force = cfg.get("prefix_dense_sliding_window_pattern", 1) == 1  # (Cohere2MoeAttention.force_rope)
    rotates = tuple(s or (force and kind == "dense") for s, kind in zip(sliding, kinds))
    rms = cfg.get("rms_norm_eps")  # (else _common's LayerNorm eps stands)
    return {
        "moe": moe if "sparse" in kinds else None,
        "intermediate_size": int(dense_width),
        "rope_layers": None if all(rotates) else rotates,
        "rms_norm": rms is not None,
        **({"rms_norm_eps": float(rms)} if rms is not None else {}),
        "mtp_layers": int(cfg.get("num_nextn_predict_layers") or 0),
    }


def _common(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Both generations' fields: LayerNorm eps, tying, the logits' scale."""
    scale = cfg.get("logit_scale", 0.0625)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise _refuse("logit_scale", scale, " (a positive number)")
    heads = fields["num_heads"]
    return {
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),  # the LayerNorms' eps
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 8192)),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attention_bias": False,
        "hidden_act": "silu",
        "rope_interleaved": True,  # (Cohere's rope turns consecutive pairs)
        "logits_divisor": 1.0 / float(scale),
    }
