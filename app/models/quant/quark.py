"""AMD Quark folders (`quant_method: "quark"`: amd's *-FP8-KV, *-MXFP4, *-w-int4 releases, which vLLM serves) read into
the shared FP8 / affine / microscaled forms, exactly as stored.

config.json's `quantization_config` holds `global_quant_config` (every Linear), `layer_quant_config` (module name or
glob -> its own), `exclude` (module names, globs, or `re:` patterns kept in float; first) and `export` (its
`pack_method`), resolved in that order as vLLM resolves them (a per-class `layer_type_quant_config` is refused). A
layer config's `weight` spec decides the module:
- fp8_e4m3 per_tensor / per_channel: `weight` e4m3 [out, in], `weight_scale` 0-d or [out] (a multiplier);
  per_block 128 x 128: `weight_scale` [ceil(out/128), ceil(in/128)] (hf_formats' FP8 reader);
  per_group 32 (or per_block [1, 32]) with scale_format e8m0: MXFP8, `weight_scale` e8m0 bytes [out, in/32].
- int8 per_tensor / per_channel, symmetric: `weight` int8 [out, in], `weight_scale`, `weight_zero_point` (zeros).
- int4 / uint4 per_group: transposed and packed along the output dimension, as AWQ: `weight` int32 [in, out/8],
  `weight_scale` [in/g, out], `weight_zero_point` int32 [in/g, out/8]; pack_method "reorder" puts column
  8c + (0, 2, 4, 6, 1, 3, 5, 7)[i] in nibble i (AWQ's order), "order" column 8c + i; int4 nibbles are two's
  complement. w = (q - zero) * scale.
- fp4 per_group 32, scale_format e8m0 (OCP MXFP4): `weight` uint8 [out, in/2], two e2m1 a byte, low nibble first;
  `weight_scale` e8m0 bytes [out, in/32].
- [fp4 per_group 16, fp8_e4m3 per_tensor] (NVFP4): `weight` as MXFP4, `weight_scale` e4m3 bytes [out, in/16],
  `weight_scale_2` the tensor's multiplier.
Activation specs (static input_scale, dynamic per-token / MX) are the kernels' speed schemes: activations stay in
float here (closer to the unquantized model), and the log says so; the KV cache's output scales (k_proj / v_proj
output_scale, the weight stream skips them) likewise. Refused in one line naming the key: fp6 and other element
types, quantized biases or outputs, fake_quantized exports, online rotations (QuaRot's R3 / R4, online R1).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from typing import Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.hf_formats import _AWQ_NIBBLE_OF_COLUMN, QuantScheme, _refuse, _unpack, _words
from lantern.app.models.quant.microscaled import MxWeight, from_bytes
from lantern.app.models.quant.mixed import SchemeTable, mixed_scheme

logger = logging.getLogger(__name__)

_KEY = "quantization_config"


def parse(q: dict[str, Any]) -> QuantScheme:
    """The QuantScheme of a Quark quantization_config: a table of each module's scheme (see the docstring)."""
    export = q.get("export") or {}
    if export.get("weight_format", "real_quantized") != "real_quantized":
        raise _refuse(f"{_KEY}.export.weight_format", export["weight_format"], " (float weights posing as quantized)")
    pack = export.get("pack_method", "reorder")
    if pack not in ("reorder", "order"):
        raise _refuse(f"{_KEY}.export.pack_method", pack)
    _check_rotations(q.get("algo_config"))
    if q.get("layer_type_quant_config"):  # (by module class: Lantern resolves module names only)
        raise _refuse(f"{_KEY}.layer_type_quant_config", q["layer_type_quant_config"], " (per-class configs)")
    kv_group = [str(g) for g in export.get("kv_cache_group") or ()]
    made: dict[str, QuantScheme | None] = {}

    def scheme_of(key: str, layer: Any, name: str = "") -> QuantScheme | None:
        kv = any(fnmatch.fnmatch(name, g) for g in kv_group) if name else False
        spelled = json.dumps([layer, pack, kv], sort_keys=True)
        if spelled not in made:
            made[spelled] = _layer_scheme(key, layer or {}, pack, kv)
        return made[spelled]

    patterns: list[tuple[str, QuantScheme | None]] = []
    exact: dict[str, QuantScheme | None] = {}
    for entry in map(str, q.get("exclude") or ()):  # kept in float, before anything else
        if entry.startswith("re:"):
            patterns.append((_regex(entry[3:], f"{_KEY}.exclude"), None))
        elif "*" in entry:  # (an older Quark's glob)
            patterns.append((fnmatch.translate(entry), None))
        else:
            exact[entry] = None
    for name, layer in (q.get("layer_quant_config") or {}).items():
        key = f"{_KEY}.layer_quant_config.{name}"
        glob = "*" in name  # (vLLM's rule: a key with * is a glob, else the module's name)
        patterns.append((fnmatch.translate(name) if glob else re.escape(name) + r"\Z", scheme_of(key, layer, name)))
    default = scheme_of(f"{_KEY}.global_quant_config", q.get("global_quant_config"))
    if default is None and not any(s is not None for _, s in patterns):
        raise _refuse(f"{_KEY}.global_quant_config", q.get("global_quant_config"), " (no weight quantization)")
    return mixed_scheme(SchemeTable(exact, tuple(patterns), default), "Quark")


def _regex(pattern: str, key: str) -> str:
    try:
        re.compile(pattern)
    except re.error as err:
        raise _refuse(key, "re:" + pattern, f" (not a regular expression: {err})") from None
    return pattern


def _check_rotations(algos: Any) -> None:
    """Offline rotations are folded into the weights; an online one (a Hadamard on activations) is refused."""
    for i, algo in enumerate(algos if isinstance(algos, list) else [algos] if algos else []):
        if not isinstance(algo, dict) or algo.get("name") not in ("rotation", "quarot"):
            continue
        online = (algo.get("online_config") or {}).get("online_rotation_layers")
        legacy = algo.get("name") == "quarot"  # (its rotations default to on)
        for flag in ("r3", "r4", "online_r1_rotation"):
            if algo.get(flag, legacy and flag != "online_r1_rotation"):
                raise _refuse(f"{_KEY}.algo_config[{i}].{flag}", True, " (an online rotation of activations)")
        if online:
            raise _refuse(f"{_KEY}.algo_config[{i}].online_config.online_rotation_layers", online)


def _layer_scheme(key: str, layer: dict[str, Any], pack: str, kv: bool) -> QuantScheme | None:
    """One layer config's scheme; None: its weights are float."""
    for part in ("bias", "output_tensors"):
        if layer.get(part) and not (part == "output_tensors" and kv):  # (the KV cache's: not applied)
            raise _refuse(f"{key}.{part}", layer[part], " (quantized outputs / biases)")
    weight = layer.get("weight")
    if not weight:
        return None
    if layer.get("input_tensors"):
        logger.info("Quark: activations quantized in the checkpoint's scheme are kept in float here")
    if isinstance(weight, list):
        if _is_nvfp4(weight):
            return QuantScheme("quark-nvfp4", 4, 16, checkpoint_format="NVFP4", mlx_mode="nvfp4")
        raise _refuse(f"{key}.weight", weight, " (of two-level specs, NVFP4's only)")
    dtype, qscheme = str(weight.get("dtype")), str(weight.get("qscheme"))
    group, e8m0 = int(weight.get("group_size") or 0), weight.get("scale_format") == "e8m0"
    if dtype == "fp8_e4m3" and e8m0:
        if (qscheme, group) == ("per_group", 32) or (qscheme, weight.get("block_size")) == ("per_block", [1, 32]):
            return QuantScheme("quark-mxfp8", 8, 32, checkpoint_format="MXFP8", mlx_mode="mxfp8")
        raise _refuse(f"{key}.weight", weight, " (MXFP8: groups of 32 along the input)")
    if dtype == "fp8_e4m3":
        if qscheme in ("per_tensor", "per_channel"):
            return QuantScheme("fp8", 8, 0, activation_scheme="static")
        if qscheme == "per_block" and list(weight.get("block_size") or ()) == [128, 128]:
            return QuantScheme("fp8", 8, 0, weight_block_size=(128, 128), activation_scheme="dynamic")
        raise _refuse(f"{key}.weight.qscheme", qscheme, " for fp8_e4m3 (per_tensor, per_channel, per_block 128x128)")
    if dtype == "fp4":
        if qscheme == "per_group" and group == 32 and e8m0:
            return QuantScheme("quark-mxfp4", 4, 32, checkpoint_format="MXFP4", mlx_mode="mxfp4")
        raise _refuse(f"{key}.weight", weight, " (fp4: per_group 32 with e8m0 scales, or NVFP4's two levels)")
    if dtype == "int8" and qscheme in ("per_tensor", "per_channel"):
        if weight.get("symmetric") is False:
            raise _refuse(f"{key}.weight.symmetric", False, " for int8 (symmetric only)")
        return QuantScheme("quark-int8", 8, -1, sym=True, checkpoint_format=f"int8 {qscheme}")
    if dtype in ("int4", "uint4") and qscheme == "per_group" and group > 0:
        return QuantScheme("quark-int4", 4, group, sym=dtype == "int4", checkpoint_format=f"{dtype} g{group} ({pack})")
    raise _refuse(f"{key}.weight", weight, " (Quark fp8_e4m3, int8, int4 / uint4 groups, MXFP4, NVFP4, MXFP8)")


def _is_nvfp4(specs: list[Any]) -> bool:
    if len(specs) != 2 or not all(isinstance(s, dict) for s in specs):
        return False
    first, second = specs
    return (first.get("dtype"), first.get("qscheme"), int(first.get("group_size") or 0)) == (
        "fp4",
        "per_group",
        16,
    ) and (
        second.get("dtype"),
        second.get("qscheme"),
    ) == ("fp8_e4m3", "per_tensor")


# ---- reading one module ----------------------------------------------------------------------------
def read_mxfp4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    return from_bytes("mxfp4", _bytes(t["weight"], prefix), t["weight_scale"], scheme.label, prefix)


def read_mxfp8(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    return from_bytes("mxfp8", _bytes(t["weight"], prefix), t["weight_scale"], scheme.label, prefix)


def read_nvfp4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    second = float(np.asarray(t["weight_scale_2"], np.float32).reshape(-1)[0])
    if not np.isfinite(second):
        raise ValueError(f"{prefix}.weight_scale_2 is {second}")
    return from_bytes("nvfp4", _bytes(t["weight"], prefix), t["weight_scale"], scheme.label, prefix, second)


def read_int4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    """int4 / uint4 groups stored transposed and packed along the output dimension (see the docstring)."""
    packed = _words(t["weight"], f"{prefix}.weight")
    scales = np.asarray(t["weight_scale"], np.float32)
    in_f, out_f, group = packed.shape[0], scales.shape[-1], scheme.group_size
    groups = in_f // group if group else 0
    if group <= 0 or in_f % group or scales.shape != (groups, out_f) or packed.shape[1] != -(-out_f // 8):
        raise ValueError(
            f"{prefix}: weight {packed.shape} and weight_scale {scales.shape} do not fit groups of {group}"
        )
    pack = "reorder" if scheme.checkpoint_format.endswith("(reorder)") else "order"
    codes = _columns(packed, out_f, pack)  # [out, in]
    zeros = t.get("weight_zero_point")
    zero = None if zeros is None else _columns(_words(zeros, f"{prefix}.weight_zero_point"), out_f, pack)
    if scheme.sym:  # two's complement nibbles: q + 8 as the stored code (zero points likewise)
        codes ^= np.uint8(8)
        zero = np.uint8(8) if zero is None else zero ^ np.uint8(8)
    s = np.ascontiguousarray(scales.T)
    z = np.zeros_like(s) if zero is None else np.asarray(zero, np.float32)
    return AffineWeight(codes, s, -z * s, 4, group, scheme.label)


def _columns(words: np.ndarray, out_f: int, pack: str) -> np.ndarray:
    """[rows, out/8] int32 of 4-bit values packed along the output -> uint8 [out, rows] in column order."""
    nibbles = _unpack(words, 4, words.shape[1] * 8).reshape(words.shape[0], -1, 8)
    if pack == "reorder":
        nibbles = nibbles[:, :, _AWQ_NIBBLE_OF_COLUMN]
    return np.ascontiguousarray(nibbles.reshape(words.shape[0], -1)[:, :out_f].T)


def _bytes(a: np.ndarray, prefix: str) -> np.ndarray:
    data = np.asarray(a)
    if data.dtype.itemsize != 1:
        raise ValueError(f"{prefix}.weight is {data.dtype}; packed microscaled codes are bytes")
    return data
