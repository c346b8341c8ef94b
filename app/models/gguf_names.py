"""GGUF tensor names -> Hugging Face names, and llama.cpp's q/k row permutation.

Shared by every backend so each loads GGUF files through the same HF-named weight map.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
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


# GGUF metadata value types -> struct format of one scalar (8 = string, 9 = array).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# Plain element types as numpy dtypes, the rest are quantized blocks read as bytes (like GGUFReader).
_PLAIN = {
    "F32": "float32",
    "F16": "float16",
    "F64": "float64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
}


@dataclass
class GGUFTensor:
    """One tensor of a GGUF file: `shape` in GGUF order (fastest dim first) and `data` a read-only
    numpy view shaped as gguf.GGUFReader shapes it, so gguf.quants.dequantize takes it as is."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: Any


@dataclass
class GGUFIndex:
    architecture: str
    metadata: dict[str, Any]  # scalar and string keys; arrays (the tokenizer's vocabulary) are skipped
    tensors: list[GGUFTensor]


def read_gguf_index(path: str) -> GGUFIndex:
    """The tensor directory of a GGUF file, without parsing the metadata arrays.

    gguf.GGUFReader builds a numpy view for every metadata element: SmolLM2's ~100k vocabulary
    strings take it 3-6 s. Here arrays are stepped over with struct and the tensors are views of
    one memory map (~50 ms).
    """
    import mmap

    import gguf
    import numpy as np

    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2 or version > 0xFFFF:  # v1 (32-bit counts) or big-endian: let gguf read it
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    pos = 24

    def read_str(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, at)
        return buf[at + 8 : at + 8 + n].decode("utf-8", errors="replace"), at + 8 + n

    def skip(vtype: int, at: int, count: int = 1) -> int:
        if vtype == 8:
            for _ in range(count):
                at += 8 + struct.unpack_from("<Q", buf, at)[0]
            return at
        if vtype == 9:
            for _ in range(count):
                etype, n = struct.unpack_from("<IQ", buf, at)
                at = skip(etype, at + 12, n)
            return at
        return at + struct.calcsize(_SCALAR[vtype]) * count

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = read_str(pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if vtype == 8:
            metadata[key], pos = read_str(pos)
        elif vtype in _SCALAR:
            (metadata[key],) = struct.unpack_from(_SCALAR[vtype], buf, pos)
            pos += struct.calcsize(_SCALAR[vtype])
        else:
            pos = skip(vtype, pos)
    infos = []
    for _ in range(n_tensors):
        name, pos = read_str(pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        qtype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, dims, gguf.GGMLQuantizationType(qtype), offset))
    align = int(metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
    start = -(-pos // align) * align
    whole = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for name, dims, qtype, offset in infos:
        shape = tuple(int(d) for d in reversed(dims))
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(shape, dtype=np.int64)) * size // block
        raw = whole[start + offset : start + offset + n_bytes]
        if qtype.name in _PLAIN:
            data = raw.view(_PLAIN[qtype.name]).reshape(shape)
        else:
            data = raw.reshape(gguf.quants.quant_shape_to_byte_shape(shape, qtype))
        tensors.append(GGUFTensor(name, qtype, tuple(int(d) for d in dims), data))
    return GGUFIndex(str(metadata.get("general.architecture", "")), metadata, tensors)


def read_gguf_dequantized(path: str, num_heads: int, num_kv_heads: int) -> dict[str, Any]:
    """Every tensor of a GGUF file as float32 numpy under its HF name, q/k rows un-permuted.

    Dequantization is the `gguf` package's reference code; backends that keep some types
    quantized read those themselves and use this for the rest.
    """
    import gguf
    import numpy as np

    index = read_gguf_index(path)
    out: dict[str, Any] = {}
    for t in index.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        shape = tuple(reversed(t.shape))
        data = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        which = needs_unpermute(name) if index.architecture in PERMUTED_ARCHITECTURES else None
        if which:
            data = unpermute_rows(data, num_heads if which == "q" else num_kv_heads)
        out[name] = data
    return out
