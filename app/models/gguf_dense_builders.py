"""GGUF builders (see gguf_builders.py) of the plain TextModel families llama.cpp converts without reordering
rows: Command R / Aya, StarCoder2, Phi-2, StableLM, Nemotron, EXAONE 3, and Gemma 3n. Each returns the config.json
keys its family reads; what the metadata cannot say comes from which tensors exist."""

from __future__ import annotations

from typing import Any

from lantern.app.models.gguf_config import _head_dim, _Meta, _rotary_fraction
from lantern.app.models.gguf_rope import rope_freqs_scaling, stated_rope_scaling


def qkv_bias(tensors: dict[str, Any]) -> bool:
    """Whether the file's q/k/v projections have biases (apart, or in a --fuse-qkv attn_qkv)."""
    return "blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors


def _command_r(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Command R / R+ / Aya 23 / Aya Expanse (llama.cpp's CommandR2Model: q/k not permuted, its rope on pairs
    on every layer; R+'s per-head q/k LayerNorms as attn_q_norm / attn_k_norm [heads, head_dim])."""
    return {
        "model_type": "cohere",
        "head_dim": _head_dim(meta, cfg),
        "layer_norm_eps": cfg["rms_norm_eps"],
        "logit_scale": float(meta.get("logit_scale") or 1.0),
        "use_qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        "attention_bias": qkv_bias(tensors),  # refused by family_cohere
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }


def _starcoder2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """StarCoder2 (llama.cpp's StarCoder2Model, a plain TextModel: q/k not permuted, the LayerNorms' eps as
    attention.layer_norm_epsilon, biases as their tensors; llama.cpp's graph has no sliding window, so none)."""
    return {
        "model_type": "starcoder2",
        "head_dim": _head_dim(meta, cfg),
        "norm_epsilon": cfg["rms_norm_eps"],
        "use_bias": qkv_bias(tensors),
        "sliding_window": None,
        "hidden_act": "gelu_pytorch_tanh",
        "rope_parameters": {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
    }


def _phi2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Phi-1 / 1.5 / 2 (llama.cpp's Phi2Model, a plain TextModel: q/k not permuted; it states feed_forward_length
    as 4 x hidden whatever the model's, so the MLP's width is its tensor's; the rope on rope.dimension_count
    dims of each head)."""
    head_dim = _head_dim(meta, cfg)
    up = tensors.get("blk.0.ffn_up.weight")
    return {
        "model_type": "phi",
        "intermediate_size": int(up.shape[1]) if up is not None else cfg["intermediate_size"],
        "layer_norm_eps": cfg["rms_norm_eps"],
        "hidden_act": "gelu_new",
        "tie_word_embeddings": cfg["tie_word_embeddings"],  # (refused by family_phi: its head has a bias)
        "rope_parameters": {
            **(stated_rope_scaling(meta) or {"rope_type": "default"}),
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        },
    }


def _stablelm(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """StableLM (llama.cpp's StableLMModel, a plain TextModel: q/k not permuted; the rope on rope.dimension_count
    dims of each head; a parallel residual (layers without ffn_norm) and per-head q/k norms (attn_q_norm): both
    refused by family_stablelm)."""
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "stablelm",
        "layer_norm_eps": cfg["rms_norm_eps"],
        "use_qkv_bias": qkv_bias(tensors),
        # llama.cpp's graph runs a layer in parallel where it has no ffn_norm (the key is True whenever the
        # converter's config.json left it out, StableLM 2 1.6B's included)
        "use_parallel_residual": "blk.0.ffn_norm.weight" not in tensors,
        "qk_layernorm": "blk.0.attn_q_norm.weight" in tensors,
        "rope_parameters": {
            **(stated_rope_scaling(meta) or {"rope_type": "default"}),
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        },
    }


def _nemotron(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nemotron / Minitron (llama.cpp's NemotronModel: q/k not permuted, LayerNorm1P's 1 + w stored and taken
    back to w by the reader; the rope on rope.dimension_count dims of each head, a linear scaling where stated)."""
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "nemotron",
        "head_dim": head_dim,
        "norm_eps": cfg["rms_norm_eps"],
        "hidden_act": "relu2",
        "attention_bias": qkv_bias(tensors),
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "rope_parameters": {
            **(stated_rope_scaling(meta) or {"rope_type": "default"}),
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        },
    }


def _exaone(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 3.0 / 3.5 / Deep (llama.cpp's ExaoneModel, a TextModel: Llama's tensors, q/k not permuted; EXAONE
    3.5's llama3 rope as rope_freqs, recovered as for Llama 3.1)."""
    rope = rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)) or {"rope_type": "default"}
    return {
        "model_type": "exaone",
        "head_dim": _head_dim(meta, cfg),
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
    }


def _gemma3n(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3n (llama.cpp's Gemma3NModel: no q/k permutation, norms as stored, the embedding tables padded
    with zero rows to vocab_size, which the per-layer table's vocabulary then is, as llama.cpp reads it). Its
    sliding pattern (else llama.cpp's default: every fifth layer full), per-layer MLP widths, shared-KV layers
    and the sparse gate's cutoffs (activation_sparsity_scale: Phi^-1 of each layer's sparsity, -inf where dense)
    come from the metadata; LAuReL's rank from its tensor."""
    layers = cfg["num_hidden_layers"]
    pattern = meta.get("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):
        sliding = [bool(x) for x in pattern][:layers]
    else:
        sliding = [(i + 1) % 5 != 0 for i in range(layers)]
    widths = meta.get("feed_forward_length")
    out: dict[str, Any] = {
        "model_type": "gemma3n_text",
        "head_dim": _head_dim(meta, cfg),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "intermediate_size": [int(w) for w in widths]
        if isinstance(widths, (list, tuple))
        else cfg["intermediate_size"],
        "sliding_window": int(meta.get("attention.sliding_window") or 512),
        "num_kv_shared_layers": int(meta.get("attention.shared_kv_layers") or 0),
        "hidden_size_per_layer_input": int(meta.need("embedding_length_per_layer_input")),
        "vocab_size_per_layer_input": int(tensors["per_layer_token_embd.weight"].shape[1]),
        "altup_num_inputs": int(meta.get("altup.num_inputs") or 4),
        "altup_active_idx": int(meta.get("altup.active_idx") or 0),
        "laurel_rank": int(tensors["blk.0.laurel_l.weight"].shape[1]),
        "final_logit_softcapping": meta.get("final_logit_softcapping"),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa", 10000.0))},
            "full_attention": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": cfg["tie_word_embeddings"],
    }
    scales = meta.get("activation_sparsity_scale")
    if isinstance(scales, (list, tuple)):  # (a file without them: Gemma3nTextConfig's default pattern)
        out["activation_sparsity_scale"] = [float(s) for s in scales]  # read by family_gemma3n as they are
    return out


def _muse_glimmer(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Muse Glimmer's language model (llama.cpp's MuseGlimmerModel: q/k permuted, the four layer norms stored as
    1 + w, qk_scale_factor folded into synthesized q-norm weights and the k norm's ones, output_multiplier as
    logit_scale; its graph rotates the sliding layers only and fixes the post-sublayer norms' eps at 1e-8)."""
    import numpy as np

    from lantern.app.models.gguf_config import _layer_types
    from lantern.app.models.spec import UnsupportedModelError

    layers, head_dim = cfg["num_hidden_layers"], _head_dim(meta, cfg)
    scales = {}
    for i in range(layers):
        for part in ("attn_q_norm", "attn_k_norm"):
            t = tensors.get(f"blk.{i}.{part}.weight")
            values = None if t is None else np.unique(np.asarray(t.data, dtype=np.float32))
            if values is None or len(values) != 1:
                raise UnsupportedModelError(
                    f"{meta.label}blk.{i}.{part}.weight is not one value (Muse Glimmer's scale)"
                )
            scales[part, i] = float(values[0])
    q_scale = scales["attn_q_norm", 0]
    if any(v != q_scale for (part, _), v in scales.items() if part == "attn_q_norm") or any(
        v != 1.0 for (part, _), v in scales.items() if part == "attn_k_norm"
    ):
        raise UnsupportedModelError(f"{meta.label}muse-glimmer q/k norm weights are not one scale and ones")
    swa_base = meta.get("rope.freq_base_swa")
    if swa_base is not None and float(swa_base) != cfg["rope_theta"]:
        raise UnsupportedModelError(f"{meta.label}muse-glimmer.rope.freq_base_swa={swa_base} is not implemented")
    rotated = int(meta.get("rope.dimension_count") or head_dim)
    if rotated != head_dim:
        raise UnsupportedModelError(f"{meta.label}muse-glimmer.rope.dimension_count={rotated} (part of a head)")
    types = _layer_types(meta, layers, 4, True)
    cap = meta.get("final_logit_softcapping")
    rope = stated_rope_scaling(meta) or {"rope_type": "default"}  # (TextModel writes linear / yarn scaling's keys)
    return {
        "model_type": "muse_glimmer_text",
        "head_dim": head_dim,
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
        "layer_types": types,
        "sliding_window": int(meta.need("attention.sliding_window")),
        "qk_scale_factor": q_scale,
        "output_multiplier": float(meta.need("logit_scale")),
        "final_logit_softcapping": float(cap) if cap else None,
        "post_norm_eps": 1e-8,  # (llama.cpp's graph: no key states it)
    }


DENSE_BUILDERS = {
    "command-r": _command_r,
    "starcoder2": _starcoder2,
    "phi2": _phi2,
    "stablelm": _stablelm,
    "nemotron": _nemotron,
    "exaone": _exaone,
    "gemma3n": _gemma3n,
    "muse-glimmer": _muse_glimmer,
}
