"""What llama.cpp's converter does per architecture, for the GGUF weight stream to undo: names
that differ from Llama's, Gemma's norms stored as 1 + w, DeepSeek's kv_b_proj split per head into
attn_k_b / attn_v_b, and multi-token-prediction layers appended after the decoder stack.

Facts from llama.cpp's convert_hf_to_gguf.py and the `gguf` package's tensor name map.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lantern.app.models.gguf_names import GGUFIndex, GGUFTensor

logger = logging.getLogger(__name__)

# Where an architecture's HF checkpoint names a llama.cpp tensor differently from Llama's
# (gguf_names._LAYER).
_GEMMA = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_FUSED = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # split by weight_stream.split_fused
ARCH_LAYER: dict[str, dict[str, str]] = {
    "gemma2": _GEMMA,
    "gemma3": _GEMMA,
    "phi3": _FUSED,
    "glm4": {**_FUSED, "post_attention_norm": "post_self_attn_layernorm", "post_ffw_norm": "post_mlp_layernorm"},
    "deepseek2": {
        "attn_q_a": "self_attn.q_a_proj",
        "attn_q_a_norm": "self_attn.q_a_layernorm",
        "attn_q_b": "self_attn.q_b_proj",
        "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm": "self_attn.kv_a_layernorm",
        "attn_kv_b": "self_attn.kv_b_proj",
        # newer converters split kv_b_proj per head (k_b transposed); joined back in join_kv_b
        "attn_k_b": "self_attn.k_b_proj",
        "attn_v_b": "self_attn.v_b_proj",
        "exp_probs_b": "mlp.gate.e_score_correction",  # .bias -> e_score_correction_bias
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
}
# Architectures whose converter stored every RMSNorm weight w as 1 + w (Gemma's norms scale by 1 + w).
NORM_PLUS_ONE = {"gemma2", "gemma3"}


def layer_of(hf: str) -> int:
    """The decoder layer an HF name belongs to; -1 for the embedding, final norm and head."""
    return int(hf.split(".", 3)[2]) if hf.startswith("model.layers.") else -1


def decoder_layers(index: GGUFIndex) -> int:
    """block_count without the multi-token-prediction layers some converters append after the
    decoder stack (`{arch}.nextn_predict_layers`): those are never run, so never loaded."""
    md, arch = index.metadata, index.architecture
    blocks = md.get(f"{arch}.block_count")
    if blocks is None:
        return 1 << 30
    return int(blocks) - int(md.get(f"{arch}.nextn_predict_layers") or 0)


def join_kv_b(halves: dict[str, Any], name: str, t: GGUFTensor) -> tuple[str, Any] | None:
    """DeepSeek's kv_b_proj [H * (nope + v), kv_lora_rank] from llama.cpp's split halves:
    attn_k_b [H, kv_lora_rank, nope] (each head's key rows transposed, for MLA's absorbed form) and
    attn_v_b [H, v, kv_lora_rank]. The transposed half cannot stay in blocks, so the joined matrix is
    float32 (exactly the file's values)."""
    from lantern.app.models.quant.affine import AffineWeight
    from lantern.app.models.quant.gguf_blocks import gguf_to_weight

    cols, rows, heads = t.shape
    w = gguf_to_weight(t.tensor_type.name, t.data, heads * rows, cols)
    w = (w.dequantize() if isinstance(w, AffineWeight) else np.asarray(w, dtype=np.float32)).reshape(heads, rows, cols)
    key = name.replace(".k_b_proj.", ".kv_b_proj.").replace(".v_b_proj.", ".kv_b_proj.")
    if ".k_b_proj." in name:
        w = w.transpose(0, 2, 1)  # [H, nope, rank]: the HF key rows of each head
    other = halves.pop(key, None)
    if other is None:
        halves[key] = (name, w)
        return None
    first, second = (other[1], w) if ".k_b_proj." in other[0] else (w, other[1])
    if first.shape[0] != second.shape[0] or first.shape[2] != second.shape[2]:
        raise ValueError(f"{key}: attn_k_b {first.shape} and attn_v_b {second.shape} do not fit together")
    joined = np.concatenate([first, second], axis=1)
    if layer_of(key) == 0:
        logger.info("GGUF attn_k_b / attn_v_b joined into kv_b_proj per layer (float32: the key half is transposed)")
    return key, np.ascontiguousarray(joined.reshape(-1, joined.shape[2]))
