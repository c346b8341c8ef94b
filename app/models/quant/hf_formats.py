"""Quantized Hugging Face folders (MLX-community, AWQ, GPTQ, FP8; compressed-tensors and bitsandbytes
in their own modules) read into the shared affine form.

`parse_quant_scheme` turns config.json's `quantization` / `quantization_config` into a `QuantScheme`
(refusing, in one line naming the key, what is not implemented), `quantized_module_names` says which
stored tensors make each quantized linear, and `read_quantized_module` converts one module exactly to
an `AffineWeight` (rows = output features, cols = input features) or an `Fp8Weight`.

Packing facts the readers rely on (published by each format; the code is Lantern's own):
- MLX affine: `weight` uint32 [out, in*bits/32], one little-endian bit stream per row;
  `scales`/`biases` [out, in/g]; w = q * scale + bias.
- AWQ GEMM (AutoAWQ): `qweight` int32 [in, out/8] packs 8 output columns per word, nibble i holding
  column 8k + AWQ_ORDER[i]; `qzeros` int32 [in/g, out/8] packed the same way; `scales` [in/g, out];
  w = (q - z) * s.
- GPTQ (2/3/4/8-bit; per-module modes and AutoRound's files: gptq_variants.py): `qweight` int32
  [in*bits/32, out] packs consecutive input rows, value j at bits j*bits of one little-endian bit
  stream per column (3-bit values straddle words); `qzeros` int32 [in/g, out*bits/32] packs
  consecutive output columns the same way; `scales` [in/g, out]; `g_idx` [in] (group of each input:
  act-order files scatter a group's columns, held sorted with the layer gathering x by the same
  permutation, exact). The v1 format ("gptq") stores zero - 1 (AutoGPTQ reads it back as
  (stored + 1) mod 2**bits); "gptq_v2" stores the zero itself. w = (q - z) * s.
- FP8 (transformers' "fp8"): `weight` float8 e4m3fn [out, in] with `weight_scale_inv` [ceil(out/b0),
  ceil(in/b1)] for weight_block_size [b0, b1] (multiplied, despite its name), or a per-tensor /
  per-channel `weight_scale`; `input_scale` (static activation scales) is not used.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight, Fp8Weight, unpack_bits
from lantern.app.models.quant.microscaled import MODES as MX_MODES
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.stacked import StackedWeights
from lantern.app.models.spec import UnsupportedModelError

if TYPE_CHECKING:
    from lantern.app.models.quant.mlx_packed import MlxPacked

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds output column 8k + AWQ_ORDER[i]
_AWQ_NIBBLE_OF_COLUMN = np.argsort(AWQ_ORDER)  # column j lives in nibble _AWQ_NIBBLE_OF_COLUMN[j]
MLX_BITS = (2, 3, 4, 5, 6, 8)
MLX_GROUPS = (32, 64, 128)
SUPPORTED = (
    "supported: MLX `quantization` (affine 2-8 bit, groups 32/64/128; mxfp4, nvfp4, mxfp8), "
    "quant_method awq (4-bit, version gemm, zero_point), gptq (2/3/4/8-bit, checkpoint_format gptq or gptq_v2, "
    "GPTQModel's dynamic), auto-round (auto_gptq / auto_awq packing), "
    "fp8 (e4m3, block or per-tensor scales), fbgemm_fp8, compressed-tensors (pack-quantized / int-quantized integer "
    "weights of 2-8 bits, float-quantized FP8, nvfp4-/mxfp4-pack-quantized, mxfp8-quantized; several config_groups "
    "of these), bitsandbytes (nf4/fp4, int8), modelopt (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, "
    "W4A16_NVFP4, MXFP8; MIXED_PRECISION of these), quark (fp8_e4m3 tensor / channel / 128x128 block, int8, "
    "int4 / uint4 groups, MXFP4, NVFP4, MXFP8; per-layer configs and excludes), bitnet (BitNet b1.58's ternary "
    "weights: bitlinear / autobitlinear, offline or online)"
)


@dataclass(frozen=True)
class QuantScheme:
    """How a quantized HF folder stores its linear weights (parsed from config.json)."""

    # "mlx" | "awq" | "gptq" | "fp8" | "ct-pack" | "ct-int" (compressed-tensors integers) | "ct-fp4" |
    # "ct-mxfp8" (its microscaled floats) | "modelopt-fp4" | "modelopt-mxfp8" | "bnb4" | "bnb8" | "mixed" |
    # "bitnet" (packed ternary) | "bitnet-online" (float masters ternarized at load)
    method: str
    bits: int  # 8 for fp8
    group_size: int  # -1: GPTQ per-channel (one group per row); 0 for fp8
    sym: bool = False  # GPTQ: zeros are 2**(bits-1) (still read from the file)
    zero_point: bool = True  # AWQ (compressed-tensors: sym says whether zero points are stored)
    desc_act: bool = False  # GPTQ act-order (g_idx then scatters the groups: see act_order_perm)
    checkpoint_format: str = ""  # GPTQ: "gptq" (v1) | "gptq_v2"; AWQ: "gemm"; compressed-tensors' format
    weight_block_size: tuple[int, int] | None = None  # FP8 block scales
    activation_scheme: str = ""  # FP8: "dynamic" | "static" (static input scales are ignored)
    # Per-module entries (MLX's, AutoRound's extra_config): prefix -> (bits, group_size), or None where
    # the module stays float; then regexes tried in order with re.match (GPTQModel's dynamic).
    overrides: dict[str, tuple[int, int] | None] = field(default_factory=dict, hash=False)
    patterns: tuple[tuple[str, tuple[int, int] | None], ...] = ()
    # MLX: "affine" or a microscaled mode (mxfp4, nvfp4, mxfp8), per module in mlx_modes; also the
    # microscaled mode of a compressed-tensors / ModelOpt float-4/8 scheme
    mlx_mode: str = "affine"
    mlx_modes: dict[str, str] = field(default_factory=dict, hash=False)
    modules_to_not_convert: tuple[str, ...] = ()
    # "mixed" (several schemes in one model): a quant.mixed.SchemeTable giving each module its own scheme
    table: Any = field(default=None, hash=False, compare=False)

    def mode_for(self, prefix: str) -> tuple[int, int] | None:
        """(bits, group_size) of one module; None when config.json keeps it in float."""
        if prefix in self.overrides:
            return self.overrides[prefix]
        for pattern, mode in self.patterns:
            if re.match(pattern, prefix):
                return mode
        return self.bits, self.group_size

    def mlx_mode_for(self, prefix: str) -> str:
        return self.mlx_modes.get(prefix, self.mlx_mode)

    @property
    def label(self) -> str:
        if self.method == "fp8":
            block = self.weight_block_size
            return "FP8 e4m3" + (f" block {block[0]}x{block[1]}" if block else "")
        group = "per-channel" if self.group_size == -1 else f"g{self.group_size}"
        if self.method.startswith("bnb"):
            return f"bitsandbytes {self.checkpoint_format}"
        if self.method.startswith("modelopt-"):
            return f"ModelOpt {self.checkpoint_format}"
        if self.method == "mixed":
            return self.checkpoint_format
        if self.method.startswith("bitnet"):
            return f"BitNet ternary ({self.checkpoint_format})"
        if self.method.startswith("quark-"):
            return f"Quark {self.checkpoint_format}"
        if self.method in ("ct-fp4", "ct-mxfp8"):
            return f"compressed-tensors {self.checkpoint_format}"
        if self.method.startswith("ct-"):
            return f"compressed-tensors {self.checkpoint_format} {self.bits}-bit {group}"
        label = f"{self.method.upper()} {self.bits}-bit {group}"
        if self.method == "gptq":
            label += " sym" if self.sym else " asym"
        return label


def _refuse(key: str, value: Any, why: str = "") -> UnsupportedModelError:
    """One line naming the key and its value, then what is supported."""
    value = json.dumps(value, default=str)
    return UnsupportedModelError(f"{key}={value} in config.json is not implemented{why}; {SUPPORTED}")


# ---- config.json -----------------------------------------------------------------------------------
def parse_quant_scheme(cfg: dict[str, Any]) -> QuantScheme | None:
    """The quantization of an HF folder's config.json; None for float weights.

    MLX-community folders carry `quantization` (mlx_lm copies it to `quantization_config`); HF
    folders carry `quantization_config` with a `quant_method`. Anything else is refused in one line.
    """
    mlx = cfg.get("quantization")
    hf = cfg.get("quantization_config")
    method = hf.get("quant_method") if isinstance(hf, dict) else None
    if mlx:
        if method is not None:
            raise _refuse("quantization_config.quant_method", method, " alongside MLX `quantization`")
        return _parse_mlx(mlx, "quantization")
    if not hf:
        return None
    if not isinstance(hf, dict):
        raise _refuse("quantization_config", hf)
    if method is None:
        if "bits" in hf and "group_size" in hf:  # what mlx_lm writes, without the `quantization` copy
            return _parse_mlx(hf, "quantization_config")
        raise _refuse("quantization_config", sorted(hf), " (no quant_method)")
    from lantern.app.models.quant import bitnet, bitsandbytes, compressed_tensors, gptq_variants, modelopt, quark

    parsers = {
        "bitnet": bitnet.parse,
        "auto-round": gptq_variants.parse_autoround,
        "intel/auto-round": gptq_variants.parse_autoround,  # (older exports)
        "modelopt": modelopt.parse,
        "bitsandbytes": bitsandbytes.parse,
        "awq": _parse_awq,
        "gptq": _parse_gptq,
        "fp8": _parse_fp8,
        "fbgemm_fp8": _parse_fbgemm_fp8,
        "compressed-tensors": compressed_tensors.parse,
        "quark": quark.parse,
    }
    parse = parsers.get(str(method).lower())
    if parse is None:
        raise _refuse("quantization_config.quant_method", method)
    return parse(hf)


def _mlx_mode(key: str, entry: dict[str, Any], bits: int, group: int) -> tuple[int, int, str]:
    # without a "mode" an entry is affine (mlx_lm passes it to to_quantized, whose default that is)
    mode = str(entry.get("mode", "affine"))
    bits, group = int(entry.get("bits", bits)), int(entry.get("group_size", group))
    if mode in MX_MODES:  # one (bits, group) each; mlx_lm writes the mode's own
        if (bits, group) != MX_MODES[mode]:
            raise _refuse(f"{key}", {"mode": mode, "bits": bits, "group_size": group}, f" ({mode} is {MX_MODES[mode]})")
        return bits, group, mode
    if mode != "affine":
        raise _refuse(f"{key}.mode", mode, " (MLX affine, mxfp4, nvfp4, mxfp8)")
    if bits not in MLX_BITS:
        raise _refuse(f"{key}.bits", bits, "")
    if group not in MLX_GROUPS:
        raise _refuse(f"{key}.group_size", group, "")
    return bits, group, mode


def _parse_mlx(q: dict[str, Any], key: str) -> QuantScheme:
    if "bits" not in q or "group_size" not in q:
        raise _refuse(key, {k: v for k, v in q.items() if not isinstance(v, dict)}, " (needs bits and group_size)")
    bits, group, mode = _mlx_mode(key, q, q["bits"], q["group_size"])
    overrides: dict[str, tuple[int, int] | None] = {}
    modes: dict[str, str] = {}
    for name, entry in q.items():
        # mlx_lm records per-module choices under the module's path: a dict of params, or a bool.
        if isinstance(entry, bool):
            overrides[name] = (bits, group) if entry else None
        elif isinstance(entry, dict):
            b, g, m = _mlx_mode(f"{key}.{name}", entry, bits, group)
            overrides[name], modes[name] = (b, g), m
    return QuantScheme("mlx", bits, group, overrides=overrides, mlx_mode=mode, mlx_modes=modes)


def _not_converted(q: dict[str, Any]) -> tuple[str, ...]:
    names = q.get("modules_to_not_convert") or q.get("ignored_layers") or ()
    return tuple(str(n) for n in names)


def _parse_awq(q: dict[str, Any]) -> QuantScheme:
    bits = int(q.get("bits", q.get("w_bit", 4)))
    if bits != 4:
        raise _refuse("quantization_config.bits", bits, " for awq")
    version = str(q.get("version") or q.get("format") or "gemm").lower()
    if version != "gemm":  # GEMV / exllama / llm-awq pack the words differently
        raise _refuse("quantization_config.version", version, " for awq")
    if not q.get("zero_point", True):
        raise _refuse("quantization_config.zero_point", False, " for awq")
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    if group <= 0:
        raise _refuse("quantization_config.group_size", group, " for awq (groups of input columns)")
    return QuantScheme("awq", 4, group, checkpoint_format="gemm", modules_to_not_convert=_not_converted(q))


def _parse_gptq(q: dict[str, Any]) -> QuantScheme:
    bits = int(q.get("bits", 4))
    if bits not in (2, 3, 4, 8):
        raise _refuse("quantization_config.bits", bits, " for gptq (2, 3, 4 or 8)")
    group = int(q.get("group_size", 128))
    if group <= 0 and group != -1:
        raise _refuse("quantization_config.group_size", group, " for gptq (-1 or a positive group)")
    fmt = str(q.get("checkpoint_format") or q.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2") or q.get("is_marlin_format"):
        raise _refuse(
            "quantization_config.checkpoint_format",
            "marlin" if q.get("is_marlin_format") else fmt,
            " for gptq",
        )
    from lantern.app.models.quant.gptq_variants import dynamic_patterns

    return QuantScheme(
        "gptq",
        bits,
        group,
        sym=bool(q.get("sym", True)),
        desc_act=bool(q.get("desc_act", False)),
        checkpoint_format=fmt,
        patterns=dynamic_patterns(q, bits, group),
        modules_to_not_convert=_not_converted(q),
    )


def _parse_fbgemm_fp8(q: dict[str, Any]) -> QuantScheme:
    """Meta's FP8 checkpoints (fbgemm): e4m3 `weight` with one float32 `weight_scale` per row; the
    activation bound (`activation_scale_ub`) is for FP8 activations, which are not used here."""
    return QuantScheme("fp8", 8, 0, activation_scheme="dynamic", modules_to_not_convert=_not_converted(q))


def _parse_fp8(q: dict[str, Any]) -> QuantScheme:
    fmt = str(q.get("fmt", "e4m3")).lower()
    if fmt not in ("e4m3", "float8_e4m3fn"):  # (MiniMax-M2's config names torch's dtype)
        raise _refuse("quantization_config.fmt", fmt, " for fp8")
    scheme = str(q.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise _refuse("quantization_config.activation_scheme", scheme, " for fp8 (dynamic or static)")
    if str(q.get("scale_fmt", "float")) != "float":
        raise _refuse("quantization_config.scale_fmt", q["scale_fmt"], " for fp8 (float32 scales only)")
    if q.get("modules_to_convert"):
        raise _refuse("quantization_config.modules_to_convert", q["modules_to_convert"], " (FP8 embedding tables)")
    # transformers' FineGrainedFP8Config defaults an absent weight_block_size to 128x128; an explicit
    # null means per-tensor scales. A scalar scale tensor is per-tensor whatever this says.
    block = q["weight_block_size"] if "weight_block_size" in q else (128, 128)
    if block is not None:
        if len(block) != 2 or min(int(b) for b in block) <= 0:
            raise _refuse("quantization_config.weight_block_size", block, " for fp8 (two positive sizes)")
        block = (int(block[0]), int(block[1]))
    return QuantScheme(
        "fp8",
        8,
        0,
        weight_block_size=block,
        activation_scheme=scheme,
        modules_to_not_convert=_not_converted(q),
    )


# ---- which tensors make a quantized module ---------------------------------------------------------
# method -> (suffixes marking a quantized module, required members, optional members)
MEMBERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "mlx": (("scales",), ("weight", "scales"), ("biases", "global_scale")),  # microscaled modes: no biases
    "awq": (("qweight",), ("qweight", "qzeros", "scales"), ()),
    "gptq": (("qweight",), ("qweight", "qzeros", "scales"), ("g_idx",)),
    "fp8": (("weight_scale_inv", "weight_scale"), ("weight",), ("input_scale",)),
    "ct-pack": (
        ("weight_packed",),
        ("weight_packed", "weight_scale"),
        ("weight_shape", "weight_zero_point", "weight_g_idx"),
    ),
    "bnb8": (("SCB",), ("weight", "SCB"), ("weight_format",)),
    "bitnet": (("weight_scale",), ("weight", "weight_scale"), ()),
    "bnb4": (
        ("weight.absmax",),
        ("weight", "weight.absmax", "weight.quant_map"),
        (
            "weight.nested_absmax",
            "weight.nested_quant_map",
            "weight.quant_state.bitsandbytes__nf4",
            "weight.quant_state.bitsandbytes__fp4",
        ),
    ),
    "ct-fp4": (("weight_packed",), ("weight_packed", "weight_scale"), ("weight_global_scale", "input_global_scale")),
    "ct-mxfp8": (("weight_scale",), ("weight", "weight_scale"), ("input_global_scale",)),
    "modelopt-fp4": (("weight_scale_2",), ("weight", "weight_scale", "weight_scale_2"), ("input_scale",)),
    "modelopt-mxfp8": (("weight_scale",), ("weight", "weight_scale"), ("input_scale",)),
    "ct-int": (
        ("weight_scale",),
        ("weight", "weight_scale"),
        ("weight_zero_point", "weight_g_idx", "input_scale", "input_zero_point"),
    ),
    "quark-int8": (
        ("weight_scale",),
        ("weight", "weight_scale"),
        ("weight_zero_point", "input_scale", "input_zero_point"),
    ),
    "quark-int4": (("weight_scale",), ("weight", "weight_scale"), ("weight_zero_point",)),
    "quark-mxfp4": (("weight_scale",), ("weight", "weight_scale"), ("input_scale",)),
    "quark-mxfp8": (("weight_scale",), ("weight", "weight_scale"), ()),
    "quark-nvfp4": (("weight_scale_2",), ("weight", "weight_scale", "weight_scale_2"), ("input_scale_2",)),
}


def quantized_module_names(scheme: QuantScheme, tensor_names: Iterable[str]) -> dict[str, list[str]]:
    """prefix -> the stored tensor names that make that quantized module, in file order.

    `.bias` tensors are not members (they stay plain float tensors). FP8's `input_scale` is a member
    so a loader consumes it, but read_quantized_module ignores it. Pass the names of every file of a
    sharded folder: a module whose members are missing raises ValueError naming them.
    """
    if scheme.method == "mixed":
        from lantern.app.models.quant import mixed

        return mixed.module_names(scheme, tensor_names)
    if scheme.method == "bitnet-online":
        from lantern.app.models.quant.bitnet import online_module_names

        return online_module_names(scheme, list(tensor_names))
    markers = MEMBERS[scheme.method][0]
    names = list(tensor_names)
    present = set(names)
    out: dict[str, list[str]] = {}
    for name in names:
        marker = next((m for m in markers if name.endswith("." + m)), None)
        prefix = name[: -len(marker) - 1] if marker else ""
        if marker is not None and prefix not in out:
            out[prefix] = module_members(scheme, prefix, present)
    return out


def module_members(scheme: QuantScheme, prefix: str, present: set[str]) -> list[str]:
    """The stored tensor names of one quantized module (required ones first); ValueError naming any missing."""
    markers, required, optional = MEMBERS[scheme.method]
    members = [f"{prefix}.{s}" for s in required]
    if scheme.method == "fp8":  # one scale tensor, under either name
        scale = next(s for s in markers if f"{prefix}.{s}" in present)
        members.append(f"{prefix}.{scale}")
    missing = [m for m in members if m not in present]
    if missing:
        raise ValueError(f"{scheme.label} module {prefix} lacks {', '.join(missing)}")
    return members + [f"{prefix}.{s}" for s in optional if f"{prefix}.{s}" in present]


# ---- reading one module ----------------------------------------------------------------------------
def read_quantized_module(
    scheme: QuantScheme, prefix: str, tensors: dict[str, np.ndarray], *, mlx_words: bool = False
) -> AffineWeight | MlxPacked | Fp8Weight | MxWeight | StackedWeights:
    """One quantized module as the shared form, exactly (MLX's stacked experts, `switch_mlp`: StackedWeights,
    one weight per expert; weight_stream.split_switch_mlp names them as the per-expert checkpoints do;
    with mlx_words, an MLX folder's affine weights as MlxPacked: the stored words, for the MLX backend).

    tensors: suffix ("qweight", "scales", ...; full names are accepted too) -> numpy array as stored,
    with float scales as float16/float32 (bf16 widened to float32 by the caller) and FP8 weights as
    uint8 bit patterns.
    """
    t = {_suffix(k, prefix): v for k, v in tensors.items()}
    from lantern.app.models.quant import bitnet, bitsandbytes, compressed_tensors, mixed, modelopt, quark

    if scheme.method == "mixed":
        scheme = mixed.module_scheme(scheme, prefix)
    if scheme.method == "mlx":
        from lantern.app.models.quant.mlx_packed import read_mlx

        return read_mlx(scheme, prefix, t, mlx_words)

    readers = {
        "modelopt-fp4": modelopt.read_fp4,
        "bnb4": bitsandbytes.read_4bit,
        "bnb8": bitsandbytes.read_int8,
        "bitnet": bitnet.read,
        "bitnet-online": bitnet.read,
        "awq": _read_awq,
        "gptq": _read_gptq,
        "fp8": _read_fp8,
        "ct-pack": compressed_tensors.read_packed,
        "ct-int": compressed_tensors.read_int,
        "ct-fp4": compressed_tensors.read_fp4,
        "ct-mxfp8": compressed_tensors.read_mxfp8,
        "modelopt-mxfp8": compressed_tensors.read_mxfp8,  # (the same tensors)
        "quark-int8": compressed_tensors.read_int,  # (the same tensors)
        "quark-int4": quark.read_int4,
        "quark-mxfp4": quark.read_mxfp4,
        "quark-mxfp8": quark.read_mxfp8,
        "quark-nvfp4": quark.read_nvfp4,
    }
    return readers[scheme.method](scheme, prefix, t)


def _suffix(key: str, prefix: str) -> str:
    return key[len(prefix) + 1 :] if key.startswith(prefix + ".") else key.lstrip(".")


def _words(a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype not in (np.int32, np.uint32):
        raise ValueError(f"{what} is {a.dtype}; packed words are int32/uint32")
    return np.ascontiguousarray(a).view(np.uint32)


def _unpack(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint32 words [rows, n] -> uint8 codes [rows, count], value j of each word at bits j*bits.

    One strided pass per position keeps the temporary at the size of the words, not 4 bytes a code."""
    if 32 % bits:
        return unpack_bits(words, bits, count)
    per = 32 // bits
    rows, n = words.shape
    out = np.empty((rows, n * per), dtype=np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for j in range(per):
        out[:, j::per] = (words >> np.uint32(j * bits)) & mask
    return out if count == out.shape[1] else np.ascontiguousarray(out[:, :count])


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _module_scheme(scheme: QuantScheme, prefix: str) -> QuantScheme:
    """`scheme` with this module's own bits and group size (per-module entries, GPTQModel's dynamic)."""
    mode = scheme.mode_for(prefix)
    if mode is None:
        raise ValueError(f"{prefix} is quantized in the file but config.json says it stays float")
    return scheme if mode == (scheme.bits, scheme.group_size) else replace(scheme, bits=mode[0], group_size=mode[1])


def _read_awq(scheme: QuantScheme, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    scheme = _module_scheme(scheme, prefix)
    qweight, qzeros, scales = _words(t["qweight"], prefix), _words(t["qzeros"], prefix), t["scales"]
    in_f, out_f = qweight.shape[0], qweight.shape[1] * 8
    groups = scales.shape[0]
    if scales.shape != (groups, out_f) or qzeros.shape != (groups, out_f // 8) or in_f != groups * scheme.group_size:
        raise ValueError(
            f"{prefix}: AWQ qweight {qweight.shape}, qzeros {qzeros.shape}, scales {scales.shape} do not fit "
            f"group size {scheme.group_size}"
        )

    def columns(words: np.ndarray) -> np.ndarray:  # AWQ nibble order -> output columns, then [out, rows]
        nibbles = _unpack(words, 4, words.shape[1] * 8).reshape(words.shape[0], -1, 8)
        return np.ascontiguousarray(nibbles[:, :, _AWQ_NIBBLE_OF_COLUMN].reshape(words.shape[0], -1).T)

    codes = columns(qweight)
    s = np.ascontiguousarray(_f32(scales).T)
    biases = -columns(qzeros).astype(np.float32) * s  # (q - z) * s = q * s + (-z * s)
    return AffineWeight(codes, s, biases, 4, scheme.group_size, scheme.label)


def _read_gptq(scheme: QuantScheme, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    scheme = _module_scheme(scheme, prefix)
    bits = scheme.bits
    qweight, qzeros, scales = _words(t["qweight"], prefix), _words(t["qzeros"], prefix), t["scales"]
    # 3-bit words do not hold whole codes: each column is one bit stream across its words (value j at bit 3j)
    in_f, out_f = qweight.shape[0] * 32 // bits, qweight.shape[1]
    group = in_f if scheme.group_size == -1 else scheme.group_size
    groups = scales.shape[0]
    whole = (qweight.shape[0] * 32) % bits == 0 and (out_f * bits) % 32 == 0
    if (
        not whole
        or scales.shape != (groups, out_f)
        or qzeros.shape != (groups, out_f * bits // 32)
        or in_f != groups * group
    ):
        raise ValueError(
            f"{prefix}: GPTQ qweight {qweight.shape}, qzeros {qzeros.shape}, scales {scales.shape} do not fit "
            f"{bits}-bit group size {scheme.group_size}"
        )
    codes = _unpack(np.ascontiguousarray(qweight.T), bits, in_f)  # [out, in]
    zeros = _unpack(qzeros, bits, out_f).astype(np.int32)  # [groups, out]
    if scheme.checkpoint_format == "gptq":
        zeros = (zeros + 1) & ((1 << bits) - 1)  # v1 stores zero - 1
    s = np.ascontiguousarray(_f32(scales).T)
    biases = -np.ascontiguousarray(zeros.T).astype(np.float32) * s
    return with_act_order(AffineWeight(codes, s, biases, bits, group, scheme.label), t.get("g_idx"), f"{prefix}.g_idx")


def with_act_order(w: AffineWeight, g_idx: np.ndarray | None, name: str) -> AffineWeight:
    """`w` (columns in file order) with act-order columns sorted into contiguous groups and the
    permutation kept for the layer to gather x by (`act_order_perm`); `w` itself otherwise."""
    perm = act_order_perm(g_idx, w.shape[1], w.group_size, name)
    if perm is None:
        return w
    return replace(w, codes=np.ascontiguousarray(w.codes[:, perm]), perm=perm, source=f"{w.source} act-order")


def act_order_perm(g_idx: np.ndarray | None, cols: int, group: int, name: str) -> np.ndarray | None:
    """The input permutation that makes act-order groups contiguous (None when they already are).

    `g_idx[i]` is the group of input column i. GPTQ with desc_act quantizes the columns in order of
    falling Hessian diagonal and numbers the groups along that order, so every group still has
    `group` members, scattered: sorting the columns by group (stably) makes stored column j input
    column perm[j], with group j // group."""
    if g_idx is None:
        return None
    g = np.asarray(g_idx).ravel().astype(np.int64)
    if g.shape != (cols,) or g.min(initial=0) < 0 or g.max(initial=0) >= cols // group:
        raise ValueError(
            f"{name} {np.asarray(g_idx).shape} does not give each of {cols} columns one of {cols // group} groups"
        )
    if np.array_equal(g, np.arange(cols) // group):
        return None
    if not np.all(np.bincount(g, minlength=cols // group) == group):
        raise UnsupportedModelError(
            f"{name} puts unequal numbers of input columns in its groups (act-order with groups of "
            f"{group} expected); this layout is not implemented"
        )
    return np.argsort(g, kind="stable").astype(np.int32)


_noted_input_scale = False


def _read_fp8(scheme: QuantScheme, prefix: str, t: dict[str, np.ndarray]) -> Fp8Weight:
    global _noted_input_scale
    data = t["weight"]
    if data.dtype.itemsize != 1 or data.dtype == np.int8:  # (int8: integer codes, not e4m3 bit patterns)
        raise ValueError(f"{prefix}.weight is {data.dtype}; FP8 weights are one byte each (e4m3fn bits)")
    data = np.ascontiguousarray(data).view(np.uint8)
    scale = _f32(t["weight_scale_inv"] if "weight_scale_inv" in t else t["weight_scale"])
    if "input_scale" in t and not _noted_input_scale:
        _noted_input_scale = True
        logger.info("FP8 input_scale tensors (static activation scales) are ignored: activations stay in float")
    rows, cols = data.shape
    if scale.size == 1:
        return Fp8Weight(data, scale.reshape(()), None, "FP8 e4m3 per-tensor")
    block = scheme.weight_block_size
    if block is not None and scale.shape == (-(-rows // block[0]), -(-cols // block[1])):
        return Fp8Weight(data, scale, block, scheme.label)
    if scale.size == rows and (scale.ndim == 1 or scale.shape == (rows, 1)):
        return Fp8Weight(data, scale.reshape(rows, 1), None, "FP8 e4m3 per-channel")
    raise ValueError(f"{prefix}: FP8 scale {scale.shape} fits neither weight {data.shape} nor block {block}")
