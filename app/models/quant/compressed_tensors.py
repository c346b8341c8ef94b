"""compressed-tensors folders (llm-compressor's format: RedHatAI / neuralmagic `*-quantized.w4a16`,
`*-w8a8`, `*-FP8-dynamic` checkpoints, which vLLM serves) read into the shared affine / FP8 forms.

config.json's `quantization_config` has `quant_method: "compressed-tensors"`, a `format` (top level
or per config group) and `config_groups` whose `weights` describe the quantization. Read exactly:
- pack-quantized (int, 2-8 bits; group, channel or tensor scales; symmetric or with zero points):
  `weight_packed` int32 [out, ceil(in * bits / 32)], one dense little-endian bit stream per row
  (MLX's layout) holding q + 2**(bits-1) for the signed integer q; `weight_scale` [out, in / g],
  [out, 1] or [1]; `weight_shape` [2]; asymmetric `weight_zero_point` packed the same way along the
  output dimension ([ceil(out * bits / 32), in / g] int32; int8 unpacked in older files).
  w = (q - zero_point) * scale.
- int-quantized / naive-quantized int (w8a8 int8): `weight` int8 [out, in], the same scales.
- float-quantized / naive-quantized float (FP8 e4m3, tensor / channel / block scales): `weight`
  float8_e4m3fn with `weight_scale`, as transformers' fp8 format (hf_formats._read_fp8).
- nvfp4-pack-quantized / mxfp4-pack-quantized / mxfp8-quantized (the microscaled float formats):
  read as stored into quant/microscaled.MxWeight (MLX computes on them natively; exact elsewhere).
Activation quantization (`input_activations`: w8a8's int8 tokens, FP8-dynamic's) is a speed scheme
of the kernels that run it; here activations stay in float (closer to the unquantized model), and
the log says so. Refused in one line naming the key: other formats (sparse, marlin-24, nvfp4/mxfp4
packs), transforms (SpinQuant/QuIP rotations).
Several config groups with different schemes (format "mixed-precision", each group its own format)
give each module its group's scheme by the group's `targets`, resolved as compressed-tensors itself
resolves them (quant/mixed.py).
actorder="group" (a permuted weight_g_idx) is held like GPTQ act-order: columns sorted, x gathered.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.hf_formats import QuantScheme, _refuse, _unpack, _words, with_act_order
from lantern.app.models.quant.microscaled import MxWeight, from_bytes
from lantern.app.models.quant.mixed import SchemeTable, mixed_scheme
from lantern.app.models.spec import UnsupportedModelError

logger = logging.getLogger(__name__)

PACKED = "pack-quantized"
INT_FORMATS = ("int-quantized", "naive-quantized")
FLOAT_FORMATS = ("float-quantized", "naive-quantized")
# microscaled formats -> (MLX mode, bits, group size)
MX_FORMATS = {
    "nvfp4-pack-quantized": ("nvfp4", 4, 16),
    "mxfp4-pack-quantized": ("mxfp4", 4, 32),
    "mxfp8-quantized": ("mxfp8", 8, 32),
}
_KEY = "quantization_config"


def parse(q: dict[str, Any]) -> QuantScheme:
    """The QuantScheme of a compressed-tensors quantization_config (see the module docstring)."""
    status = q.get("quantization_status", "compressed")
    if status != "compressed":  # "frozen" / "calibration": float weights with unapplied quantization
        raise _refuse(f"{_KEY}.quantization_status", status, " (compressed checkpoints only)")
    sparsity = q.get("sparsity_config") or {}
    if sparsity and sparsity.get("format", "dense") != "dense":
        raise _refuse(f"{_KEY}.sparsity_config.format", sparsity.get("format"), " (sparse weights)")
    if q.get("transform_config"):
        raise _refuse(f"{_KEY}.transform_config", sorted(q["transform_config"]), " (rotated weights)")
    groups = {name: g for name, g in (q.get("config_groups") or {}).items() if (g or {}).get("weights")}
    if not groups:
        raise _refuse(f"{_KEY}.config_groups", q.get("config_groups"), " (no weight quantization)")
    if q.get("kv_cache_scheme"):
        logger.info("compressed-tensors: kv_cache_scheme is not applied; the KV cache holds the model's dtype")
    not_converted = tuple(str(n) for n in q.get("ignore") or ())
    spelled = {
        name: json.dumps([g["weights"], g.get("format") or q.get("format")], sort_keys=True)
        for name, g in groups.items()
    }
    if len(set(spelled.values())) == 1:  # one scheme: every quantized module is read with it
        name, group = next(iter(groups.items()))
        return _group_scheme(f"{_KEY}.config_groups.{name}", group, q, not_converted)
    # several schemes (format "mixed-precision"): each module takes its group's, by the group's targets,
    # resolved as the library that wrote the file does (compressed_tensors.utils.match.match_targets): an
    # exact name first, then `re:` patterns (re.match) in the order of their strings, then the class
    # "Linear"; a target listed by two groups belongs to the later one.
    by_target: dict[str, QuantScheme] = {}
    made: dict[str, QuantScheme] = {}
    for name, group in groups.items():
        key = f"{_KEY}.config_groups.{name}"
        if spelled[name] not in made:
            made[spelled[name]] = _group_scheme(key, group, q, not_converted)
        for target in map(str, group.get("targets") or ()):
            if target.startswith("re:"):
                try:
                    re.compile(target[3:])
                except re.error as err:
                    raise _refuse(f"{key}.targets", target, f" (not a regular expression: {err})") from None
            elif target != "Linear" and "." not in target and target != "lm_head":
                # another class name (attention or MoE blocks, embeddings): not resolved to modules here
                raise _refuse(f"{key}.targets", target, " with several groups (module names, re: patterns or Linear)")
            by_target[target] = made[spelled[name]]
    exact = {t: s for t, s in by_target.items() if not t.startswith("re:") and t != "Linear"}
    patterns = tuple((t[3:], s) for t, s in sorted(by_target.items()) if t.startswith("re:"))
    default = by_target.get("Linear")
    return mixed_scheme(SchemeTable(exact, patterns, default), "compressed-tensors")


def _group_scheme(key: str, group: dict[str, Any], q: dict[str, Any], not_converted: tuple[str, ...]) -> QuantScheme:
    """The QuantScheme of one config group."""
    fmt = str(group.get("format") or q.get("format") or "")
    w = group["weights"]
    kind, bits, strategy = w.get("type", "int"), int(w.get("num_bits", 8)), w.get("strategy", "tensor")
    _note_kept_float(group)
    if fmt in MX_FORMATS:
        mode, want_bits, want_group = MX_FORMATS[fmt]
        if (kind, bits, int(w.get("group_size") or 0)) != ("float", want_bits, want_group):
            raise _refuse(f"{key}.weights", w, f" for {fmt} ({want_bits}-bit floats in groups of {want_group})")
        if w.get("symmetric") is False:  # zero points on float codes: no reader for weight_zero_point
            raise _refuse(f"{key}.weights.symmetric", False, f" for {fmt}")
        scale_dtype = str(w.get("scale_dtype") or "")
        if scale_dtype and not scale_dtype.endswith("float8_e4m3fn" if mode == "nvfp4" else "uint8"):
            raise _refuse(f"{key}.weights.scale_dtype", scale_dtype, f" for {fmt}")
        return QuantScheme(
            "ct-fp4" if want_bits == 4 else "ct-mxfp8",
            want_bits,
            want_group,
            checkpoint_format=fmt,
            mlx_mode=mode,
            modules_to_not_convert=not_converted,
        )
    if kind == "float":
        if fmt not in FLOAT_FORMATS or bits != 8:
            raise _refuse(f"{key}.format" if fmt not in FLOAT_FORMATS else f"{key}.weights.num_bits", fmt or bits)
        if strategy not in ("tensor", "channel", "block"):
            raise _refuse(f"{key}.weights.strategy", strategy, " for FP8 weights")
        block = _block(w.get("block_structure"), key) if strategy == "block" else None
        return QuantScheme(
            "fp8", 8, 0, weight_block_size=block, activation_scheme="dynamic", modules_to_not_convert=not_converted
        )
    if kind != "int":
        raise _refuse(f"{key}.weights.type", kind)
    if fmt != PACKED and fmt not in INT_FORMATS:
        raise _refuse(f"{key}.format", fmt or None)
    if not 2 <= bits <= 8:
        raise _refuse(f"{key}.weights.num_bits", bits, " (2 to 8 bits)")
    if strategy not in ("group", "channel", "tensor"):
        raise _refuse(f"{key}.weights.strategy", strategy, " for integer weights")
    size = int(w.get("group_size") or 0) if strategy == "group" else -1
    if strategy == "group" and size <= 0:
        raise _refuse(f"{key}.weights.group_size", w.get("group_size"))
    return QuantScheme(
        "ct-pack" if fmt == PACKED else "ct-int",
        bits if fmt == PACKED else 8,  # int8 storage holds any width up to 8 as 8-bit codes
        size,
        sym=bool(w.get("symmetric", True)),
        desc_act=w.get("actorder") == "group",
        checkpoint_format=fmt,
        modules_to_not_convert=not_converted,
    )


def _block(value: Any, key: str) -> tuple[int, int]:
    """[rows, cols] of an FP8 block, or the older "RxC" string form."""
    try:
        parts = value.split("x") if isinstance(value, str) else list(value)
        block = tuple(int(b) for b in parts)
    except (TypeError, ValueError):
        block = ()
    if len(block) != 2 or min(block) <= 0:
        raise _refuse(f"{key}.weights.block_structure", value, " (two positive sizes)")
    return block  # type: ignore[return-value]


def _note_kept_float(group: dict[str, Any]) -> None:
    acts = group.get("input_activations")
    if acts:
        kind = f"{acts.get('type', 'int')}{acts.get('num_bits', 8)}"
        logger.info(
            "compressed-tensors: activations quantized to %s in the checkpoint's scheme are kept in float here "
            "(weight-only kernels: results closer to the unquantized model)",
            kind,
        )


# ---- reading one module ----------------------------------------------------------------------------
def read_fp4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    """nvfp4-/mxfp4-pack-quantized: `weight_packed` uint8 [out, in / 2] (two e2m1 a byte, low nibble
    first), `weight_scale` e4m3 (nvfp4, groups of 16) or e8m0 (mxfp4, 32) bytes [out, in / g], and for
    nvfp4 `weight_global_scale` [1], which divides: w = e2m1 * scale / global."""
    glob = t.get("weight_global_scale")
    divisor = float(np.asarray(glob, np.float32).reshape(-1)[0]) if glob is not None else 1.0
    if not np.isfinite(divisor) or divisor == 0:
        raise ValueError(f"{prefix}.weight_global_scale is {divisor}")
    packed = np.asarray(t["weight_packed"])
    if packed.dtype != np.uint8:
        raise ValueError(f"{prefix}.weight_packed is {packed.dtype}; {scheme.checkpoint_format} packs bytes")
    return from_bytes(scheme.mlx_mode, packed, t["weight_scale"], scheme.label, prefix, 1.0 / divisor)


def read_mxfp8(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    """mxfp8-quantized: `weight` e4m3 bytes [out, in], `weight_scale` e8m0 bytes [out, in / 32]."""
    data = np.asarray(t["weight"])
    if data.dtype.itemsize != 1:
        raise ValueError(f"{prefix}.weight is {data.dtype}; mxfp8 weights are one byte each (e4m3 bits)")
    return from_bytes("mxfp8", data, t["weight_scale"], scheme.label, prefix)


def read_packed(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    """A pack-quantized module (weight_packed, weight_scale[, weight_shape, weight_zero_point])."""
    bits = scheme.bits
    packed = _words(t["weight_packed"], f"{prefix}.weight_packed")
    rows = packed.shape[0]
    shape = t.get("weight_shape")
    cols = int(np.asarray(shape).ravel()[-1]) if shape is not None else packed.shape[1] * 32 // bits
    if packed.shape[1] != math.ceil(cols * bits / 32):
        raise UnsupportedModelError(
            f"{prefix}.weight_packed {packed.shape} does not hold {cols} columns as one dense {bits}-bit stream per "
            "row: a compressed-tensors packing older than its dense layout is not implemented"
        )
    codes = _unpack(packed, bits, cols)
    scale, group = _scales(t["weight_scale"], rows, cols, scheme, prefix)
    offset = 1 << (bits - 1)
    zeros = t.get("weight_zero_point")
    if zeros is None or scheme.sym:
        zero_codes: np.ndarray | float = float(offset)
    elif zeros.dtype in (np.int32, np.uint32):  # packed along the output dimension
        words = np.ascontiguousarray(_words(zeros, f"{prefix}.weight_zero_point").T)
        zero_codes = np.ascontiguousarray(_unpack(words, bits, rows).T).astype(np.float32)
    else:  # older files (and tensor-wide zero points): signed int8, unpacked
        zero_codes = _signed_zeros(zeros, rows) + offset
    w = AffineWeight(codes, scale, -(zero_codes * scale), bits, group, scheme.label)
    return with_act_order(w, t.get("weight_g_idx"), f"{prefix}.weight_g_idx")


def read_int(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    """An int-/naive-quantized integer module: `weight` int8 [out, in] and its scales (w8a8)."""
    q = t["weight"]
    if q.dtype != np.int8:
        raise ValueError(f"{prefix}.weight is {q.dtype}; compressed-tensors integer weights are int8")
    rows, cols = q.shape
    scale, group = _scales(t["weight_scale"], rows, cols, scheme, prefix)
    zeros = t.get("weight_zero_point")
    zero = 0.0 if zeros is None or scheme.sym else _signed_zeros(zeros, rows)
    codes = np.ascontiguousarray(q).view(np.uint8) ^ np.uint8(0x80)  # q + 128
    w = AffineWeight(codes, scale, -((zero + 128.0) * scale), 8, group, scheme.label)
    return with_act_order(w, t.get("weight_g_idx"), f"{prefix}.weight_g_idx")


def _signed_zeros(zeros: np.ndarray, rows: int) -> np.ndarray:
    z = np.asarray(zeros, np.float32)
    return z.reshape(()) if z.size == 1 else z.reshape(rows, -1)


def _scales(raw: np.ndarray, rows: int, cols: int, scheme: Any, prefix: str) -> tuple[np.ndarray, int]:
    """float32 scales [rows, groups] and the group size: tensor ([1] or a scalar) and channel
    ([rows, 1]) scales are one group per row."""
    scale = np.asarray(raw, np.float32)
    if scale.size == 1:
        return np.full((rows, 1), float(scale.reshape(())), np.float32), cols
    if scale.shape == (rows, 1) or scale.shape == (rows,):
        return np.ascontiguousarray(scale.reshape(rows, 1)), cols
    group = scheme.group_size
    if scale.ndim != 2 or scale.shape[0] != rows or group <= 0 or scale.shape[1] * group != cols:
        raise ValueError(f"{prefix}: weight_scale {scale.shape} does not fit [{rows}, {cols}] in groups of {group}")
    return np.ascontiguousarray(scale), group
