"""GGUF config builders of the architectures llama.cpp names apart whose maths is a family Lantern already serves:
InternLM2 / 2.5 and XVERSE (Llama), Orion (StableLM's layer), Qwen (1) (Qwen2's), MiniCPM 1 / 2 / 4 (Granite's
scalars), Deci / Nemotron-NAS (family_deci's per-layer shapes), BitNet (Llama with subln norms) and HRM-Text, each as
llama.cpp's converter writes it and its runtime reads it (see gguf_builders.py)."""

from __future__ import annotations

import math
from typing import Any

from lantern.app.models.gguf_config import _head_dim, _Meta
from lantern.app.models.gguf_dense_builders import qkv_bias
from lantern.app.models.gguf_rope import longrope_tensors, rope_freqs_scaling, stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError


def _plain_rope(meta: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    return {**(stated_rope_scaling(meta) or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]}


def _llama(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """InternLM2 / 2.5 (llama.cpp's InternLM2Model: wqkv split into q, k and v, q/k permuted as Llama's) and XVERSE
    (XverseModel: q/k permuted): Llama's layer under the architecture's name. InternLM2's dynamic NTK is not
    written (the converter drops it), so the file's rope is plain, as llama.cpp computes it."""
    return {
        "model_type": "llama",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": qkv_bias(tensors),  # (refused: Llama's attention_bias also puts one on o_proj)
        "rope_parameters": _plain_rope(meta, cfg),
    }


def _orion(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Orion (llama.cpp's OrionModel: a TextModel, nothing permuted; its config's rms_norm_eps written as the
    LayerNorms' eps, no rope base, so llama.cpp's 10000): StableLM's layer — LayerNorms with biases before
    attention and the MLP, one after the last layer — with the NeoX rope over the whole head."""
    return {
        "model_type": "stablelm",
        "layer_norm_eps": cfg["rms_norm_eps"],
        "use_qkv_bias": qkv_bias(tensors),
        "use_parallel_residual": False,
        "qk_layernorm": False,
        "rope_parameters": {**_plain_rope(meta, cfg), "partial_rotary_factor": 1.0},
    }


def _qwen(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen (1) (llama.cpp's QwenModel: a TextModel; c_attn as attn_qkv with its bias, nothing permuted;
    feed_forward_length is the HF config's intermediate_size, twice each projection's width, as llama.cpp's graph
    halves it): Qwen2's layer with q/k/v biases, every query head its own K/V. Qwen's dynamic NTK and log-n
    attention (past its training length) are not in the file: llama.cpp computes neither."""
    up = tensors.get("blk.0.ffn_up.weight")
    return {
        "model_type": "qwen2",
        "intermediate_size": int(up.shape[1]) if up is not None else cfg["intermediate_size"] // 2,
        "num_key_value_heads": cfg["num_attention_heads"],
        "use_sliding_window": False,
        "rope_parameters": _plain_rope(meta, cfg),
    }


def _minicpm(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM 1 / 2 / 4 (llama.cpp's MiniCPMModel: q/k permuted as Llama's; its runtime runs Granite's graph):
    muP's three scalars as embedding_scale (scale_emb), residual_scale (scale_depth / sqrt(layers)) and
    logit_scale (hidden_size / dim_model_base), queries scaled by head_dim ** -0.5, LongRoPE (MiniCPM4) as the two
    factor tensors. Where a key is missing, the values every MiniCPM shipped with (12, 1.4 / sqrt(layers), a
    dim_model_base of 256): llama.cpp's defaults for the first two; for the third it divides the logits by
    256 / hidden_size, the inverse of MiniCPM's (and of its own earlier graph), so such a file is read as the
    model it was converted from."""
    if meta.get("expert_count"):
        raise UnsupportedModelError(f"{meta.label}minicpm.expert_count (MiniCPM-MoE) is not implemented")
    head_dim = _head_dim(meta, cfg)
    layers = cfg["num_hidden_layers"]
    out: dict[str, Any] = {
        "model_type": "granite",
        "head_dim": head_dim,
        "attention_multiplier": float(meta.get("attention.scale") or head_dim**-0.5),
        "embedding_multiplier": float(meta.get("embedding_scale") or 12.0),
        "residual_multiplier": float(meta.get("residual_scale") or 1.4 / math.sqrt(layers)),
        "logits_scaling": float(meta.get("logit_scale") or cfg["hidden_size"] / 256),
        "attention_bias": qkv_bias(tensors),  # refused by family_granite
    }
    longrope = longrope_tensors(meta, tensors, cfg)
    if longrope is not None:
        out["rope_scaling"] = longrope
    else:
        out["rope_parameters"] = _plain_rope(meta, cfg)
    return out


def _per_layer(meta: _Meta, key: str, layers: int, default: Any = None) -> list[int]:
    value = meta.get(key, default) if default is not None else meta.need(key)
    values = list(value) if isinstance(value, (list, tuple)) else [value] * layers
    if len(values) != layers:
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.{key} has {len(values)} values for {layers} layers")
    return [int(v) for v in values]


def _deci(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-NAS / DeciLM (llama.cpp's DeciModel: q/k permuted as Llama's, each layer by its own KV heads; the
    llama3 rope as rope_freqs): the per-layer head_count (0: no attention), head_count_kv (0 under heads: the 51B's
    linear layer) and feed_forward_length (0: no MLP) as Nemotron-NAS's block_configs, each MLP's width stated."""
    layers = cfg["num_hidden_layers"]
    heads = _per_layer(meta, "attention.head_count", layers)
    kv = _per_layer(meta, "attention.head_count_kv", layers, heads)
    widths = _per_layer(meta, "feed_forward_length", layers)
    top, blocks = max(heads), []
    for i, (h, k, w) in enumerate(zip(heads, kv, widths)):
        if h not in (0, top) or (k and top % k):
            raise UnsupportedModelError(f"{meta.label}deci layer {i}: {h} heads over {k} KV heads are not implemented")
        attention = (
            {"no_op": True} if h == 0 else {"replace_with_linear": True} if k == 0 else {"n_heads_in_group": top // k}
        )
        blocks.append({"attention": attention, "ffn": {"no_op": True} if w == 0 else {"intermediate_size": w}})
    rope = rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)) or {"rope_type": "default"}
    return {
        "model_type": "nemotron-nas",
        "head_dim": _head_dim(meta, cfg),
        "block_configs": blocks,
        "attention_bias": qkv_bias(tensors),  # refused by family_deci
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
    }


def _nanbeige(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nanbeige 4.2 (llama.cpp's NanbeigeModel, a LlamaModel: q/k permuted, a llama3 rope as rope_freqs) with its
    num_loops and skip_loop_final_norm (absent: one loop, the norm between loops)."""
    rope = rope_freqs_scaling(meta, tensors, stated_rope_scaling(meta)) or {"rope_type": "default"}
    return {
        "model_type": "nanbeige",
        "head_dim": _head_dim(meta, cfg),
        "num_loops": int(meta.get("num_loops") or 1),
        "skip_loop_final_norm": bool(meta.get("skip_loop_final_norm", False)),
        "attention_bias": qkv_bias(tensors),
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
    }


def _talkie(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Talkie (llama.cpp's TalkieModel: a TextModel, q / k with the reversed rope folded in, the head's gain as
    logit_scale)."""
    return {
        "model_type": "talkie",
        "head_dim": _head_dim(meta, cfg),
        "logit_scale": float(meta.need("logit_scale")),
        "talkie_rope_absorbed": True,  # (family_talkie: a plain rope on these q / k)
    }


def _openelm(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """OpenELM (llama.cpp's OpenELMModel: a TextModel, nothing permuted, q / k / v fused in attn_qkv, proj_1 split
    into ffn_gate / ffn_up): the per-layer head_count, head_count_kv and feed_forward_length as OpenELM's
    num_query_heads / num_kv_heads and its MLP widths (ffn_widths: stated, not recomputed from multipliers)."""
    layers = cfg["num_hidden_layers"]
    return {
        "model_type": "openelm",
        "num_transformer_layers": layers,
        "model_dim": cfg["hidden_size"],
        "head_dim": _head_dim(meta, cfg),
        "num_query_heads": _per_layer(meta, "attention.head_count", layers),
        "num_kv_heads": _per_layer(meta, "attention.head_count_kv", layers),
        "ffn_widths": _per_layer(meta, "feed_forward_length", layers),
        "max_context_length": cfg["max_position_embeddings"],
        "rope_freq_constant": cfg["rope_theta"],
        "share_input_output_layers": cfg["tie_word_embeddings"],
        "normalize_qk_projections": "blk.0.attn_q_norm.weight" in tensors,
    }


def _bitnet(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """BitNet b1.58 (llama.cpp's BitnetModel: a TextModel, nothing permuted; the projections ternarized by the
    absmean rule and stored as ternary times their scale, in float or TQ1_0 / TQ2_0 blocks): Llama's layer with
    the subln norms, SiLU-gated as llama.cpp's graph computes it. The activations are not quantized per token
    (llama.cpp's graph does not; its TQ dot products round them to 8 bits per 256 columns), so the file's values
    are multiplied as they are. Per-projection `.scale` tensors (other converters' layout) are refused."""
    scaled = sorted(name for name in tensors if name.endswith(".scale"))
    if scaled:
        raise UnsupportedModelError(f"{meta.label}bitnet tensor {scaled[0]}: per-projection scales are not implemented")
    return {
        "model_type": "bitnet",
        "hidden_act": "silu",
        "head_dim": _head_dim(meta, cfg),
        "attention_bias": qkv_bias(tensors),  # (refused by family_bitnet)
        "rope_parameters": _plain_rope(meta, cfg),
    }


def _hrm_text(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """HRM-Text (llama.cpp's HrmTextModel: a TextModel, nothing permuted; the fused gqkv / gate_up split into
    attn_gate, q, k, v and ffn_gate, up; the L stack's layers as blocks 0.., the H stack's after them, block_count
    the stack passes' KV layers): its stacks' shape and cycles from hrm.*, embedding_scale as written (none: 1, as
    llama.cpp's graph), multi-head (no head_count_kv written), its plain NeoX rope. No norm tensors: its norms have
    no weight. Causal only, as llama.cpp computes it (hrm.prefix_lm is not read)."""
    per_stack, h, low = (int(meta.need(f"hrm.{k}")) for k in ("layers_per_stack", "h_cycles", "l_cycles"))
    if cfg["num_hidden_layers"] != per_stack * h * (low + 1):
        raise UnsupportedModelError(
            f"{meta.label}hrm_text.block_count={cfg['num_hidden_layers']} is not layers_per_stack x h_cycles x "
            f"(l_cycles + 1) = {per_stack * h * (low + 1)}"
        )
    head_dim = int(meta.get("attention.key_length") or meta.get("rope.dimension_count") or _head_dim(meta, cfg))
    return {
        "model_type": "hrm_text",
        "num_layers_per_stack": per_stack,
        "H_cycles": h,
        "L_cycles": low,
        "head_dim": head_dim,
        "embedding_scale": float(meta.get("embedding_scale") or 1.0),
        "attention_bias": qkv_bias(tensors),  # (refused by family_hrm_text)
        "rope_parameters": _plain_rope(meta, cfg),
    }


LLAMA_RELATIVE_BUILDERS = {
    "hrm_text": _hrm_text,
    "bitnet": _bitnet,
    "internlm2": _llama,
    "xverse": _llama,
    "orion": _orion,
    "qwen": _qwen,
    "minicpm": _minicpm,
    "deci": _deci,
    "openelm": _openelm,
    "nanbeige": _nanbeige,
    "talkie": _talkie,
}
