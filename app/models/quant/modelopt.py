"""NVIDIA ModelOpt checkpoints (`nvidia/*-FP8`, `nvidia/*-FP4`, TensorRT-Model-Optimizer exports) read into
the shared forms.

The scheme is config.json's `quantization_config` with `quant_method: "modelopt"` and a `quant_algo`,
or, in older exports, only `hf_quant_config.json` beside it (`{"quantization": {"quant_algo": ...,
"exclude_modules": [...]}}`). Excluded modules are simply stored in float. Read exactly:
- FP8 (per-tensor `weight_scale`), FP8_PER_CHANNEL_PER_TOKEN (`weight_scale` [out]), FP8_PB_WO (block
  `weight_scale` of 128x128): `weight` float8 e4m3, as transformers' fp8 format (hf_formats._read_fp8).
- NVFP4 / W4A16_NVFP4: `weight` uint8 [out, in / 2] (two e2m1 a byte, low nibble first), `weight_scale`
  e4m3 [out, in / 16] and `weight_scale_2` (one float32 that multiplies the tensor): w = e2m1 * scale *
  weight_scale_2, held as quant/microscaled.MxWeight("nvfp4").
- MXFP8: `weight` e4m3 [out, in] and `weight_scale` e8m0 bytes [out, in / 32] (2^(s - 127)), as
  compressed-tensors' mxfp8-quantized: MxWeight("mxfp8").
- MIXED_PRECISION (NVIDIA's NVFP4 releases: NVFP4 experts, FP8 / MXFP8 attention): `quantized_layers`
  gives each module one of the above (quant/mixed.py); modules it does not list are stored in float.
`input_scale` (static activation scales: FP8 / FP4 activations) is not applied, as for every format here:
activations stay in float. KV-cache scales (`k_scale`, `v_scale`) are skipped by the weight stream.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from lantern.app.models.quant.hf_formats import QuantScheme, _refuse
from lantern.app.models.quant.microscaled import MxWeight, from_bytes
from lantern.app.models.quant.mixed import SchemeTable, mixed_scheme

logger = logging.getLogger(__name__)

FP8_ALGOS = {"FP8": None, "FP8_PER_CHANNEL_PER_TOKEN": None, "FP8_PB_WO": (128, 128)}
FP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
ALGOS = (*FP8_ALGOS, *FP4_ALGOS, "MXFP8", "MIXED_PRECISION")
_KEY = "quantization_config.quant_algo"


def config_from_folder(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    """config.json with an older export's hf_quant_config.json folded in as its quantization_config
    (or, for a MIXED_PRECISION config.json without its per-module map, the map the side file holds)."""
    side = folder / "hf_quant_config.json"
    q = cfg.get("quantization_config")
    if not side.is_file() or cfg.get("quantization"):
        return cfg
    quant = json.loads(side.read_text()).get("quantization") or {}
    if not q:
        return {**cfg, "quantization_config": {"quant_method": "modelopt", **quant}}
    mixed = isinstance(q, dict) and str(q.get("quant_algo", "")).upper() == "MIXED_PRECISION"
    if mixed and not q.get("quantized_layers") and quant.get("quantized_layers"):
        return {**cfg, "quantization_config": {**q, "quantized_layers": quant["quantized_layers"]}}
    return cfg


def parse(q: dict[str, Any]) -> QuantScheme:
    if isinstance(q.get("quantization"), dict):  # hf_quant_config.json's nesting, copied into config.json
        q = {**q, **q["quantization"]}
    algo = str(q.get("quant_algo") or "").upper()
    kv = q.get("kv_cache_quant_algo") or q.get("kv_cache_scheme")
    if kv:
        kind = kv if isinstance(kv, str) else f"{kv.get('type', 'int')}{kv.get('num_bits', 8)}"
        logger.info("ModelOpt: the KV cache's %s quantization is not applied (it holds the model's dtype)", kind)
    if algo == "MIXED_PRECISION":
        return _mixed(q)
    return _algo_scheme(algo, q, "quantization_config")


def _algo_scheme(algo: str, entry: dict[str, Any], key: str) -> QuantScheme:
    """The scheme of one quant_algo (the whole model's, or one module's in a MIXED_PRECISION map)."""
    if algo in FP8_ALGOS:
        return QuantScheme("fp8", 8, 0, weight_block_size=FP8_ALGOS[algo], activation_scheme="static")
    if algo in FP4_ALGOS:
        group = int(entry.get("group_size") or 16)
        if group != 16:
            raise _refuse(f"{key}.group_size", group, " for ModelOpt NVFP4 (16)")
        return QuantScheme("modelopt-fp4", 4, 16, checkpoint_format=algo, mlx_mode="nvfp4")
    if algo == "MXFP8":
        group = int(entry.get("group_size") or 32)
        if group != 32:
            raise _refuse(f"{key}.group_size", group, " for ModelOpt MXFP8 (32)")
        return QuantScheme("modelopt-mxfp8", 8, 32, checkpoint_format=algo, mlx_mode="mxfp8")
    raise _refuse(f"{key}.quant_algo", algo or None, f" for modelopt (supported: {', '.join(ALGOS)})")


def _mixed(q: dict[str, Any]) -> QuantScheme:
    """MIXED_PRECISION: `quantized_layers` maps each quantized module's checkpoint name to its own
    quant_algo (and group_size); a module it does not list is stored in float."""
    layers = q.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        # (DeepSeek-style W4AFP8 exports say MIXED_PRECISION with no map: int4 experts for FP8 activations)
        raise _refuse(_KEY, "MIXED_PRECISION", " without a quantized_layers map naming each module's algo")
    by_entry: dict[str, QuantScheme] = {}
    exact: dict[str, QuantScheme] = {}
    for name, entry in layers.items():
        key = f"quantization_config.quantized_layers.{name}"
        if not isinstance(entry, dict):
            raise _refuse(key, entry, " (a dict with quant_algo)")
        spelled = json.dumps(entry, sort_keys=True)
        if spelled not in by_entry:  # thousands of expert entries share a handful of schemes
            by_entry[spelled] = _algo_scheme(str(entry.get("quant_algo") or "").upper(), entry, key)
        exact[name] = by_entry[spelled]
    return mixed_scheme(SchemeTable(exact), "ModelOpt")


def read_fp4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    weight = np.asarray(t["weight"])
    if weight.dtype != np.uint8:
        raise ValueError(f"{prefix}.weight is {weight.dtype}; ModelOpt NVFP4 packs two e2m1 values a byte")
    second = float(np.asarray(t["weight_scale_2"], np.float32).reshape(-1)[0])
    if not np.isfinite(second):
        raise ValueError(f"{prefix}.weight_scale_2 is {second}")
    return from_bytes("nvfp4", weight, t["weight_scale"], f"ModelOpt {scheme.checkpoint_format}", prefix, second)
