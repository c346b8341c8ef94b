"""GGUF tensor names -> Hugging Face names, and llama.cpp's q/k row permutation.

Shared by every backend so each loads GGUF files through the same HF-named weight map.
"""
from __future__ import annotations

import re
from typing import Any

_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias|scales|biases)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")

# Architectures whose llama.cpp converter permuted q/k rows for its interleaved rotary layout.
PERMUTED_ARCHITECTURES = {"llama", "mistral"}


def hf_name(gguf_name: str) -> str | None:
    """HF parameter name for a GGUF tensor name; None for tensors we do not use (rope_freqs...)."""
    m = _LAYER_RE.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        mapped = _LAYER.get(part)
        return f"model.layers.{layer}.{mapped}.{kind}" if mapped else None
    m = _GLOBAL_RE.match(gguf_name)
    if m and m.group(1) in _GLOBAL:
        return f"{_GLOBAL[m.group(1)]}.{m.group(2)}"
    return None


def unpermute_rows(w: Any, n_heads: int) -> Any:
    """Undo llama.cpp's q/k permutation along the output (row) axis.

    Works for numpy, MLX and torch arrays alike, and for packed quantized rows (scales and biases
    too): only whole rows move.
    """
    rows = w.shape[0]
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def needs_unpermute(hf: str) -> str | None:
    """'q' or 'k' when the HF tensor is a permuted q/k projection row block."""
    if ".self_attn.q_proj." in hf:
        return "q"
    if ".self_attn.k_proj." in hf:
        return "k"
    return None


def read_gguf_dequantized(path: str, num_heads: int, num_kv_heads: int) -> dict[str, Any]:
    """Every tensor of a GGUF file as float32 numpy under its HF name, q/k rows un-permuted.

    Dequantization is the `gguf` package's reference code; backends that keep some types
    quantized read those themselves and use this for the rest.
    """
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    out: dict[str, Any] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        data = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        which = needs_unpermute(name) if arch in PERMUTED_ARCHITECTURES else None
        if which:
            data = unpermute_rows(data, num_heads if which == "q" else num_kv_heads)
        out[name] = data
    return out
