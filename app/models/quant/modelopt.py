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

logger = logging.getLogger(__name__)

FP8_ALGOS = {"FP8": None, "FP8_PER_CHANNEL_PER_TOKEN": None, "FP8_PB_WO": (128, 128)}
FP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
_KEY = "quantization_config.quant_algo"


def config_from_folder(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    """config.json with an older export's hf_quant_config.json folded in as its quantization_config."""
    side = folder / "hf_quant_config.json"
    if cfg.get("quantization_config") or cfg.get("quantization") or not side.is_file():
        return cfg
    quant = json.loads(side.read_text()).get("quantization") or {}
    return {**cfg, "quantization_config": {"quant_method": "modelopt", **quant}}


def parse(q: dict[str, Any]) -> QuantScheme:
    if isinstance(q.get("quantization"), dict):  # hf_quant_config.json's nesting, copied into config.json
        q = {**q, **q["quantization"]}
    algo = str(q.get("quant_algo") or "").upper()
    kv = q.get("kv_cache_quant_algo") or q.get("kv_cache_scheme")
    if kv:
        kind = kv if isinstance(kv, str) else f"{kv.get('type', 'int')}{kv.get('num_bits', 8)}"
        logger.info("ModelOpt: the KV cache's %s quantization is not applied (it holds the model's dtype)", kind)
    if algo in FP8_ALGOS:
        return QuantScheme("fp8", 8, 0, weight_block_size=FP8_ALGOS[algo], activation_scheme="static")
    if algo in FP4_ALGOS:
        group = int(q.get("group_size") or 16)
        if group != 16:
            raise _refuse("quantization_config.group_size", group, " for ModelOpt NVFP4 (16)")
        return QuantScheme("modelopt-fp4", 4, 16, checkpoint_format=algo, mlx_mode="nvfp4")
    raise _refuse(_KEY, algo or None, f" for modelopt (supported: {', '.join([*FP8_ALGOS, *FP4_ALGOS])})")


def read_fp4(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> MxWeight:
    weight = np.asarray(t["weight"])
    if weight.dtype != np.uint8:
        raise ValueError(f"{prefix}.weight is {weight.dtype}; ModelOpt NVFP4 packs two e2m1 values a byte")
    second = float(np.asarray(t["weight_scale_2"], np.float32).reshape(-1)[0])
    if not np.isfinite(second):
        raise ValueError(f"{prefix}.weight_scale_2 is {second}")
    return from_bytes("nvfp4", weight, t["weight_scale"], f"ModelOpt {scheme.checkpoint_format}", prefix, second)
