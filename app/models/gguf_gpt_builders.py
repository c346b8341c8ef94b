"""GGUF builders (see gguf_builders.py) of the GPT-2-era families: GPT-2, StarCoder (GPT-BigCode), GPT-NeoX and
Falcon, as llama.cpp's converter writes them (conversion/gpt2.py, starcoder.py, gptneox.py, falcon.py), and OLMo (1)
(conversion/olmo.py: Llama's tensors, q/k permuted as Llama's, no norm weights, clip_qkv as clamp_kqv), BLOOM
(conversion/bloom.py) and MPT (conversion/mpt.py). Each returns
the config.json keys its family module reads (family_gpt2 / family_gptneox); what the metadata cannot say comes from
which tensors exist. The converters state the MLP as 4 x hidden whatever the model's (GPT-2, StarCoder, Falcon):
its width is the ffn_up tensor's. Their q/k/v arrive as one attn_qkv of q rows, then k, then v (GPT-NeoX's and
Falcon's reordered so by the converter), which weight_stream.split_fused cuts."""

from __future__ import annotations

from typing import Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.gguf_config import _head_dim, _Meta, _rotary_fraction


def _mlp_width(tensors: dict[str, Any], cfg: dict[str, Any]) -> int:
    up = tensors.get("blk.0.ffn_up.weight")
    return int(up.shape[1]) if up is not None else cfg["intermediate_size"]


def _gpt2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """GPT-2 (GPT2Model: Conv1D matrices stored transposed, as nn.Linear; the position table as position_embd;
    llama.cpp's graph takes GELU's tanh form, GPT-2's gelu_new)."""
    return {
        "model_type": "gpt2",
        "n_inner": _mlp_width(tensors, cfg),
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "activation_function": "gelu_new",
    }


def _starcoder(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """StarCoder / SantaCoder (StarCoderModel: GPT-BigCode's nn.Linear tensors as they are, one K/V head)."""
    return {
        "model_type": "gpt_bigcode",
        "multi_query": cfg["num_key_value_heads"] == 1,
        "n_inner": _mlp_width(tensors, cfg),
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "activation_function": "gelu_pytorch_tanh",
    }


def _gptneox(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """GPT-NeoX / Pythia (GPTNeoXModel: the rope on rope.dimension_count dims of each head, base 10000 as no key
    states one; use_parallel_residual; biases as their tensors). Its MLP is the checkpoint's exact GELU."""
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "gpt_neox",
        "rotary_pct": _rotary_fraction(meta, head_dim),
        "rotary_emb_base": cfg["rope_theta"],
        "use_parallel_residual": bool(meta.get("use_parallel_residual", True)),
        "attention_bias": "blk.0.attn_qkv.bias" in tensors,
        "layer_norm_eps": cfg["rms_norm_eps"],
        "hidden_act": "gelu",
    }


def _falcon(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Falcon (FalconModel: q/k/v regrouped to q, k, v rows; the MLP's own norm, ln_mlp, as attn_norm_2, which
    only the new decoder architecture has; its K/V heads as head_count_kv)."""
    kv, two_norms = cfg["num_key_value_heads"], "blk.0.attn_norm_2.weight" in tensors
    new = kv > 1 or two_norms
    return {
        "model_type": "falcon",
        "new_decoder_architecture": new,
        "multi_query": not new,
        "num_kv_heads": kv,
        "num_ln_in_parallel_attn": 2 if two_norms else 1,
        "parallel_attn": True,
        "bias": "blk.0.attn_qkv.bias" in tensors,
        "ffn_hidden_size": _mlp_width(tensors, cfg),
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
    }


def _olmo(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """OLMo (1) (OlmoModel: its weightless LayerNorms have no tensors; q/k rows permuted, undone by the reader)."""
    return {
        "model_type": "olmo",
        "head_dim": _head_dim(meta, cfg),
        "clip_qkv": meta.get("attention.clamp_kqv"),
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # (refused by family_olmo1)
    }


def _bloom(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """BLOOM (BloomModel: per-head q/k/v rows regrouped to q, k, v; the embedding LayerNorm as token_embd_norm; its
    context_length is seq_length)."""
    return {
        "model_type": "bloom",
        "n_head": cfg["num_attention_heads"],
        "n_layer": cfg["num_hidden_layers"],
        "seq_length": cfg["max_position_embeddings"],
        "layer_norm_epsilon": cfg["rms_norm_eps"],
    }


def _mpt(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """MPT (MPTModel: q/k/v as stored in Wqkv, clip_qkv as clamp_kqv, ALiBi's bias max as max_alibi_bias, 0 where the
    model has none; biases as their tensors, which family_mpt refuses)."""
    bias_max = float(meta.get("attention.max_alibi_bias") or 0.0)
    if cfg["num_key_value_heads"] != cfg["num_attention_heads"]:  # (the converter's kv_n_heads: grouped-query MPT)
        raise UnsupportedModelError(
            f"{meta.name}: mpt.attention.head_count_kv={cfg['num_key_value_heads']} (grouped-query MPT) is not "
            "implemented; transformers' MPT is multi-head"
        )
    return {
        "model_type": "mpt",
        "d_model": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"],
        "n_layers": cfg["num_hidden_layers"],
        "max_seq_len": cfg["max_position_embeddings"],
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "no_bias": "blk.0.attn_qkv.bias" not in tensors,
        "attn_config": {
            "clip_qkv": meta.get("attention.clamp_kqv"),
            "alibi": bias_max > 0,
            "alibi_bias_max": bias_max or 8.0,
        },
    }


GPT_BUILDERS = {
    "mpt": _mpt,
    "bloom": _bloom,
    "gpt2": _gpt2,
    "starcoder": _starcoder,
    "gptneox": _gptneox,
    "falcon": _falcon,
    "olmo": _olmo,
}
