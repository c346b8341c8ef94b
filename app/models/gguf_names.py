"""GGUF files: tensor names -> Hugging Face names, llama.cpp's q/k row permutation, split files, and
the stream of (HF name, weight) every backend loads a GGUF through.

Shared by every backend so each loads GGUF files through the same HF-named weight map.
"""

from __future__ import annotations

import logging
import mmap
import re
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lantern.app.models.gguf_arch import (
    ARCH_BARE,
    ARCH_GLOBAL,
    ARCH_LAYER,
    LAYER_NORMS_PLUS_ONE,
    NORM_PLUS_ONE,
    decoder_layers,
    glm4v_rotary,
    gptoss_expert_tensor,
    gptoss_experts,
    join_kv_b,
    layer_of,
    pairs_from_halves,
)
from lantern.app.models.gguf_config import moe_config_from_gguf  # noqa: F401  (re-exported: its old home)

logger = logging.getLogger(__name__)

_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "position_embd": "model.embed_positions",  # GPT-2 / StarCoder's learned position table
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
    # Mixtures of experts: the router, Qwen2-MoE's shared expert and its gate ({n_embd}, 1-D in GGUF)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# llama.cpp stacks each projection's experts in one 3-D tensor (ne2 = experts); the stream yields them
# one expert at a time under the checkpoints' per-expert names (mlp.experts.<e>.<proj>.weight).
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z0-9_.]+)\.(weight|bias|scales|biases)$")
# Gemma 4's router scales, named `.scale` by its converter: HF's router.scale and router.per_expert_scale
# (family_gemma4 names them mlp.router_scale / mlp.per_expert_scale)
_SCALE_RE = re.compile(r"^blk\.(\d+)\.(ffn_gate_inp|ffn_down_exps)\.scale$")
_SCALES = {"ffn_gate_inp": "mlp.router_scale", "ffn_down_exps": "mlp.per_expert_scale"}
_TALKIE_SCALE_RE = re.compile(r"^blk\.(\d+)\.(attn_output|ffn_down)\.scale$")
_TALKIE_SCALES = {"attn_output": "attn_gain", "ffn_down": "mlp_gain"}
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")
_BARE_RE = re.compile(r"^blk\.(\d+)\.(ssm_a|ssm_d|exp_probs_b)$")

# Architectures whose llama.cpp converter permuted q/k rows for its interleaved rotary layout.
# mistral3 / smollm3 / arcee / granite / granitemoe: Ministral3Model, SmolLM3Model, ArceeModel, GraniteModel and
# GraniteMoeModel are LlamaModels; GraniteHybridModel and its NemotronHModel set undo_permute too (NoPE attention
# computes the same either way; the tensors are the checkpoint's again)
PERMUTED_ARCHITECTURES = {
    "llama",
    "olmo",  # OlmoModel permutes as LlamaModel
    "arcee",
    "mistral",
    "mistral3",
    "smollm3",
    "granite",
    "granitemoe",
    "granite_swa",  # (GraniteSWAModel and GraniteMoeSWAModel are GraniteModels)
    "granitehybrid",
    "nemotron_h",
    "nemotron_h_moe",
    "internlm2",  # InternLM2Model permutes the q / k it splits from wqkv as LlamaModel
    "xverse",  # XverseModel, BaichuanModel and MiniCPMModel permute as LlamaModel
    "minicpm",
    "deci",  # DeciModel: each layer's k rows by its own KV heads
    "nanbeige",  # NanbeigeModel is a LlamaModel
    "deepseek",  # DeepseekModel and BailingMoeModel permute as LlamaModel
    "bailingmoe",
    "muse-glimmer",  # MuseGlimmerModel un-permutes transformers' q/k layout the same way
}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """HF parameter name for a GGUF tensor name of architecture `arch`; None for tensors we do not
    use (rope_freqs, Phi-3's rope factors: the config readers gguf_rope / gguf_config take those)."""
    from lantern.app.models.gguf_encoder import ENCODER_ARCHITECTURES, encoder_tensor_name

    if arch in ENCODER_ARCHITECTURES:  # an encoder: the encoder files' names directly
        return encoder_tensor_name(gguf_name, arch)
    m = _LAYER_RE.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        if part in _EXPERTS:
            return f"model.layers.{layer}.mlp.experts.{_EXPERTS[part]}.{kind}"
        if part == "ffn_gate_up_exps":  # Gemma 4's experts, gate and up rows in one tensor (split while read)
            return f"model.layers.{layer}.mlp.experts.gate_up_proj.{kind}"
        mapped = ARCH_LAYER.get(arch, {}).get(part) or _LAYER.get(part)
        dropped = arch == "muse-glimmer" and part in ("attn_q_norm", "attn_k_norm")  # (its builder read their scale)
        if mapped is None or dropped:
            return None
        hf = f"model.layers.{layer}.{mapped}.{kind}"
        hf = hf.replace(".e_score_correction.bias", ".e_score_correction_bias").replace(".sinks.weight", ".sinks")
        hf = hf.replace(".layer_scalar.weight", ".layer_scalar").replace(
            ".correct_output_scale.weight", ".correct_output_scale"
        )
        hf = hf.replace(".linear_attn.dt.bias", ".linear_attn.dt_bias").replace(".mamba.dt.bias", ".mamba.dt_bias")
        return hf.replace(".self_attn.dt.bias", ".self_attn.dt_bias")  # (Kimi Linear's)
    m = _SCALE_RE.match(gguf_name)
    if m:
        return f"model.layers.{m.group(1)}.{_SCALES[m.group(2)]}"
    m = _TALKIE_SCALE_RE.match(gguf_name) if arch == "talkie" else None
    if m:  # (Talkie's sublayer gains, which its converter writes as the output projections' scales)
        return f"model.layers.{m.group(1)}.{_TALKIE_SCALES[m.group(2)]}"
    m = _BARE_RE.match(gguf_name)  # Qwen3-Next's A, Granite 4.0-H's A and D, HY-V3's router bias (without a suffix)
    if m:
        bare = ARCH_BARE.get(arch, {"ssm_a": "linear_attn.A_log"}).get(m.group(2))
        return None if bare is None else f"model.layers.{m.group(1)}.{bare}"
    if arch == "hrm_text" and gguf_name == "hrm.z_l_init":  # (HRM-Text's initial z_L, written without a suffix)
        return "model.z_L_init"
    m = _GLOBAL_RE.match(gguf_name)
    if m and m.group(1) in ARCH_GLOBAL.get(arch, {}):
        return f"{ARCH_GLOBAL[arch][m.group(1)]}.{m.group(2)}"
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
_SMALL_ARRAY = 4096  # metadata arrays longer than this (token types, scores) are not read
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


_FOLIO_SPAN = 2 << 20  # the largest page-cache folio a fault maps at once (a PMD)


@dataclass
class GGUFTensor:
    """One tensor of a GGUF file: `shape` in GGUF order (fastest dim first) and `data` a read-only
    numpy view shaped as gguf.GGUFReader shapes it, so gguf.quants.dequantize takes it as is."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: Any
    offset: int = 0  # where the data starts in the file (bytes)
    n_bytes: int = 0


@dataclass
class GGUFIndex:
    architecture: str
    # scalar and string keys, numeric arrays of up to _SMALL_ARRAY values as tuples; longer and
    # string arrays (the tokenizer's vocabulary) are skipped
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]
    path: str = ""
    buffer: Any = None  # the read-only mmap the tensors' data view

    def release(self, tensor: GGUFTensor) -> None:
        """Drop the tensor's pages from this process's resident set once it has been converted.

        The mapping is read-only and file-backed, so the data stays correct (a later read faults it
        back in from the page cache); without this, every page read stays resident and loading peaks
        at file size + converted weights.
        """
        if self.buffer is None or not tensor.n_bytes or not hasattr(mmap, "MADV_DONTNEED"):
            return
        # From the 2 MiB boundary below: kernels with large page-cache folios (ext4 on Linux 6.x)
        # map a whole folio on a fault, so reading this tensor's first page maps the previous
        # tensor's tail again after it was released.
        start = tensor.offset // _FOLIO_SPAN * _FOLIO_SPAN
        end = min(len(self.buffer), tensor.offset + tensor.n_bytes)
        try:
            self.buffer.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError) as exc:  # not fatal: only memory is at stake
            logger.debug("madvise failed for %s: %s", tensor.name, exc)


def _decimal(vtype: int, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """float32 values as the shortest decimal that rounds to them (1e-05, not 9.9999997e-06): what
    the converter wrote from config.json."""
    return tuple(float(str(np.float32(v))) for v in values) if vtype == 6 else values


def read_gguf_index(path: str) -> GGUFIndex:
    """The tensor directory of a GGUF file, without parsing the long metadata arrays.

    gguf.GGUFReader builds a numpy view for every metadata element: SmolLM2's ~100k vocabulary
    strings take it 3-6 s. Here long arrays are stepped over with struct (short numeric ones, such
    as per-layer values, are read) and the tensors are views of one memory map (~50 ms).
    """
    import gguf

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
            (metadata[key],) = _decimal(vtype, struct.unpack_from(_SCALAR[vtype], buf, pos))
            pos += struct.calcsize(_SCALAR[vtype])
        else:
            etype, n = struct.unpack_from("<IQ", buf, pos)
            if etype in _SCALAR and n <= _SMALL_ARRAY:  # per-layer values (head counts, sliding flags)
                fmt = _SCALAR[etype]
                metadata[key] = _decimal(etype, struct.unpack_from(f"{fmt[0]}{n}{fmt[1]}", buf, pos + 12))
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
        tensors.append(GGUFTensor(name, qtype, tuple(int(d) for d in dims), data, start + offset, n_bytes))
    return GGUFIndex(str(metadata.get("general.architecture", "")), metadata, tensors, str(path), buf)


# ---- split files and the weight stream ---------------------------------------------------------------
# llama.cpp's gguf-split names: <stem>-00001-of-00003.gguf; only the first part carries the model's
# metadata, every part carries split.no / split.count / split.tensors.count.
SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")  # on a file stem: the model name without it
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def gguf_split_parts(path: str | Path) -> list[Path]:
    """Every file of the model `path` belongs to, first part first: [path] for a single file, all
    `<stem>-0000i-of-0000N.gguf` next to it for a split one (whichever part was named).

    Raises FileNotFoundError naming the missing parts.
    """
    p = Path(path)
    m = _SPLIT_RE.match(p.name)
    if not m:
        return [p]
    count = int(m["count"])
    suffix = p.name[-5:]  # keep the spelling of ".gguf" the user's files have
    parts = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}{suffix}") for i in range(1, count + 1)]
    missing = [q.name for q in parts if not q.is_file()]
    if missing:
        raise FileNotFoundError(
            f"split GGUF model {parts[0].name} has {count} parts; missing in {p.parent}: {', '.join(missing)}"
        )
    return parts


def gguf_tensor_names(path: str | Path) -> list[str]:
    """GGUF tensor names across every part (e.g. whether "output.weight" exists decides
    tie_word_embeddings, and in a split file it may live in a later part)."""
    return [t.name for q in gguf_split_parts(path) for t in read_gguf_index(str(q)).tensors]


def _read_split(path: str | Path) -> list[GGUFIndex]:
    """The indexes of every part, checked against the split metadata the parts carry."""
    parts = gguf_split_parts(path)
    indexes = [read_gguf_index(str(q)) for q in parts]
    declared = int(indexes[0].metadata.get("split.count", 1) or 1)
    if declared != len(parts):
        raise ValueError(
            f"{parts[0].name}: its metadata says split.count={declared}, but {len(parts)} file(s) were found "
            f"(split files must keep llama.cpp's <name>-0000i-of-0000N.gguf names)"
        )
    if len(parts) > 1:
        for i, index in enumerate(indexes):
            no = index.metadata.get("split.no")
            if no is not None and int(no) != i:
                raise ValueError(f"{parts[i].name}: split.no={no}, expected {i}")
        total = indexes[0].metadata.get("split.tensors.count")
        found = sum(len(index.tensors) for index in indexes)
        if total is not None and int(total) != found:
            raise ValueError(f"{parts[0].name}: split.tensors.count={total}, but the parts hold {found} tensors")
    return indexes


def _rows_cols(t: GGUFTensor) -> tuple[int, int]:
    """GGUF dims are fastest-first: ne0 = input features (cols), the rest multiply into rows."""
    rows = 1
    for d in t.shape[1:]:
        rows *= d
    return rows, t.shape[0]


def iter_gguf_weights(path: str | Path, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, Any]]:
    """(HF name, weight) for every tensor the model uses, one at a time, from every part of a
    (possibly split) GGUF file.

    Block types come as `AffineWeight` (exact, see quant.gguf_blocks; the codebook types wider than
    in the file, logged once: quant.gguf_decoded), F32/F16/BF16 as numpy arrays
    (F16 stays float16). What llama.cpp's converter did to a tensor is undone: q/k rows un-permuted
    for PERMUTED_ARCHITECTURES, Gemma's 1 + w norms back to w, DeepSeek's split attn_k_b/attn_v_b
    joined into kv_b_proj, gpt-oss's MXFP4 experts as the OpenAI checkpoint's blocks / scales
    (gguf_arch.gptoss_experts); multi-token-prediction layers past the decoder stack are skipped. Each
    tensor's file pages are released after conversion, so peak memory stays near what the caller
    keeps. An unsupported block type is refused before anything is converted.
    """
    from lantern.app.models.quant.affine import AffineWeight
    from lantern.app.models.quant.gguf_blocks import SUPPORTED_TYPES, gguf_to_weight
    from lantern.app.models.quant.gguf_decoded import DECODED, HELD_WIDER, widening_note
    from lantern.app.models.spec import UnsupportedModelError

    indexes = _read_split(path)
    arch = indexes[0].architecture
    layers = decoder_layers(indexes[0])
    used = [(index, t, hf_name(t.name, arch)) for index in indexes for t in index.tensors]
    used = [(index, t, name) for index, t, name in used if name is not None and layer_of(name) < layers]
    for _, t, name in used:
        if t.tensor_type.name not in SUPPORTED_TYPES and not gptoss_expert_tensor(arch, name, t):
            raise UnsupportedModelError(
                f"{Path(path).name}: tensor {t.name} is GGUF type {t.tensor_type.name}, which is not supported; "
                f"supported types: {', '.join(SUPPORTED_TYPES)}"
            )
    widened = Counter(
        t.tensor_type.name
        for _, t, name in used
        if t.tensor_type.name in {*DECODED, *HELD_WIDER} and not gptoss_expert_tensor(arch, name, t)
    )
    if widened:
        logger.warning("%s: %s", Path(path).name, widening_note(dict(widened)))
    permuted = arch in PERMUTED_ARCHITECTURES
    # (K/V heads stated per layer -- Nemotron-NAS, the hybrids' 0 on state layers: each layer's k rows by its own)
    kv_per_layer = indexes[0].metadata.get(f"{arch}.attention.head_count_kv")
    kv_per_layer = kv_per_layer if isinstance(kv_per_layer, (list, tuple)) else None
    neox_rotary = glm4v_rotary(indexes[0].metadata, arch)
    halves: dict[str, Any] = {}  # a layer's attn_k_b until its attn_v_b is read (gpt-oss: gate until up)
    for index, t, name in used:
        if gptoss_expert_tensor(arch, name, t):  # MXFP4 projections and biases, gate and up joined
            yield from gptoss_experts(halves, name, t)
            index.release(t)
            continue
        if len(t.shape) == 3 and ".mlp.experts." in name:
            yield from _split_experts(t, name)
            index.release(t)
            continue
        if ".self_attn.k_b_proj." in name or ".self_attn.v_b_proj." in name:
            joined = join_kv_b(halves, name, t)
            index.release(t)
            if joined is not None:
                yield joined
            continue
        rows, cols = _rows_cols(t)
        w = gguf_to_weight(t.tensor_type.name, t.data, rows, cols)
        which = needs_unpermute(name) if permuted else None
        if which:
            n = num_heads if which == "q" else int(kv_per_layer[layer_of(name)]) if kv_per_layer else num_kv_heads
            if isinstance(w, AffineWeight):
                w = w.map_rows(lambda a, n=n: unpermute_rows(a, n))
            else:
                w = unpermute_rows(w, n)
        if neox_rotary and (which := needs_unpermute(name)):  # GLM-4V's q/k rows (and biases) in pair order again
            n = num_heads if which == "q" else num_kv_heads
            if isinstance(w, AffineWeight):
                w = w.map_rows(lambda a, n=n: pairs_from_halves(a, n, neox_rotary))
            else:
                w = pairs_from_halves(w, n, neox_rotary)
        if name.endswith("shared_expert_gate.weight") and len(w.shape) == 1:
            w = w.reshape(1, -1)  # llama.cpp stores the shared expert's gate as a vector
        plus_one = arch in LAYER_NORMS_PLUS_ONE and name.endswith("layernorm.weight")
        if plus_one or (arch in NORM_PLUS_ONE and name.endswith("norm.weight")):
            w = np.asarray(w, dtype=np.float32) - np.float32(1.0)  # Gemma's converter stored 1 + w
        index.release(t)
        yield name, w
    if halves:
        raise ValueError(f"{Path(path).name}: {', '.join(sorted(halves))} without its other half (k_b/v_b, gate/up)")


def _split_experts(t: GGUFTensor, name: str) -> Iterator[tuple[str, Any]]:
    """A stacked [E, rows, cols] expert tensor as E per-expert weights, each converted from its own
    slice of the raw blocks (only one expert's unpacked codes exist at a time)."""
    from lantern.app.models.quant.gguf_blocks import gguf_to_weight

    cols, rows, experts = t.shape
    stem, proj, kind = name.rsplit(".", 2)  # "model.layers.N.mlp.experts", "gate_proj", "weight"
    for e in range(experts):
        w = gguf_to_weight(t.tensor_type.name, t.data[e], rows, cols)
        if proj == "gate_up_proj":  # gate rows first (Gemma 4's ffn_gate_up_exps)
            half = rows // 2
            yield f"{stem}.{e}.gate_proj.{kind}", _row_slice(w, 0, half)
            yield f"{stem}.{e}.up_proj.{kind}", _row_slice(w, half, rows)
        else:
            yield f"{stem}.{e}.{proj}.{kind}", w


def _row_slice(w: Any, start: int, end: int) -> Any:
    return w.rows(start, end) if hasattr(w, "rows") else w[start:end]
