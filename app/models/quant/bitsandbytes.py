"""bitsandbytes folders (`quant_method: "bitsandbytes"`: the `*-bnb-4bit` and LLM.int8 checkpoints
transformers saves) read into the shared affine form.

Storage facts (what transformers writes for a bitsandbytes layer; the code is Lantern's own):
- 8-bit (LLM.int8, `load_in_8bit`): `weight` int8 [out, in] and `SCB` float32 [out], each row's
  absolute maximum: w = q * SCB / 127. Exact as 8-bit codes q + 128 with one scale per row. (The
  outlier threshold is a compute-time split, not a storage one: it does not change the weights.)
- 4-bit (`load_in_4bit`, nf4 or fp4): `weight` uint8 [out * in / 2, 1] holds the row-major
  flattened 4-bit indices, the first of each pair in the high nibble; per block of `blocksize`
  consecutive weights an absmax; `weight.quant_map` float32 [16] the levels; w = quant_map[i] *
  absmax. With double quantization (`weight.nested_absmax`), absmax is stored as uint8 indices:
  absmax = nested_quant_map[a] * nested_absmax[block // nested_blocksize] + nested_offset. The
  block and nesting sizes and the offset come from `weight.quant_state.bitsandbytes__<type>`, a JSON
  blob stored as uint8.
NF4's levels are normal-distribution quantiles and FP4's are e2m1 floats with a subnormal, so no
integer code holds them exactly: each level is rounded to the nearest of 255 steps of the block's
absmax (8-bit codes, one scale per block) — off by at most ~0.4% of the absmax, a property of the
level table, logged once. torch's VNNI layers then hold the 16 codes as 4-bit indices (a codebook),
so the weights take about the file's size there; MLX and CUDA hold 8-bit codes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight, map_codes
from lantern.app.models.quant.hf_formats import QuantScheme, _refuse
from lantern.app.models.spec import UnsupportedModelError

logger = logging.getLogger(__name__)

STATE_KEYS = ("weight.quant_state.bitsandbytes__nf4", "weight.quant_state.bitsandbytes__fp4")
_noted: set[str] = set()


def parse(q: dict[str, Any]) -> QuantScheme:
    """The QuantScheme of a bitsandbytes quantization_config."""
    skip = tuple(str(n) for n in q.get("llm_int8_skip_modules") or ())
    storage = str(q.get("bnb_4bit_quant_storage", "uint8")).lower().removeprefix("torch.")
    if q.get("load_in_4bit") and storage != "uint8":
        raise _refuse("quantization_config.bnb_4bit_quant_storage", storage, " for bitsandbytes (uint8 only)")
    if q.get("load_in_4bit"):
        kind = str(q.get("bnb_4bit_quant_type", "fp4")).lower()
        if kind not in ("nf4", "fp4"):
            raise _refuse("quantization_config.bnb_4bit_quant_type", kind, " for bitsandbytes")
        return QuantScheme("bnb4", 4, 0, checkpoint_format=kind, modules_to_not_convert=skip)
    if q.get("load_in_8bit"):
        return QuantScheme("bnb8", 8, -1, sym=True, checkpoint_format="int8", modules_to_not_convert=skip)
    raise _refuse("quantization_config.load_in_4bit", q.get("load_in_4bit"), " (bitsandbytes without 4- or 8-bit)")


def read_int8(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    q, row_max = t["weight"], np.asarray(t["SCB"], np.float32).reshape(-1, 1)
    layout = t.get("weight_format")
    if layout is not None and int(np.asarray(layout).ravel()[0]) != 0:  # 0: row; older files: tiled GPU layouts
        raise UnsupportedModelError(
            f"{prefix}.weight_format={int(np.asarray(layout).ravel()[0])}: bitsandbytes int8 weights in a tiled "
            "GPU layout (col_turing / col_ampere) are not implemented; supported: the row layout (weight_format 0)"
        )
    if q.dtype != np.int8 or q.ndim != 2 or row_max.shape[0] != q.shape[0]:
        raise ValueError(f"{prefix}: bitsandbytes int8 weight {q.dtype} {q.shape} with SCB {row_max.shape}")
    scale = row_max / np.float32(127)
    codes = np.ascontiguousarray(q).view(np.uint8) ^ np.uint8(0x80)  # q + 128
    return AffineWeight(codes, scale, -128 * scale, 8, q.shape[1], "bitsandbytes int8 per-channel")


def read_4bit(scheme: Any, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    key = next((k for k in STATE_KEYS if k in t), None)
    if key is None:
        raise ValueError(f"{prefix} lacks its weight.quant_state.bitsandbytes__nf4 / __fp4 blob")
    state = json.loads(np.asarray(t[key], np.uint8).tobytes())
    missing = [k for k in ("shape", "blocksize") if k not in state]
    if missing or ("weight.nested_absmax" in t and not {"nested_blocksize", "nested_offset"} <= set(state)):
        raise ValueError(f"{prefix}.{key} lacks {', '.join(missing) or 'nested_blocksize / nested_offset'}")
    rows, cols = (int(d) for d in state["shape"])
    block = int(state["blocksize"])
    if cols % block:
        raise UnsupportedModelError(
            f"{prefix}: bitsandbytes blocks of {block} weights run across rows of {cols} (not a multiple); "
            "only blocks within a row are implemented"
        )
    packed = np.asarray(t["weight"], np.uint8).reshape(-1)
    if packed.size * 2 != rows * cols:
        raise ValueError(f"{prefix}: {packed.size} bytes of bitsandbytes 4-bit codes for a [{rows}, {cols}] weight")
    absmax = _absmax(t, state, rows * cols // block)
    levels = np.asarray(t["weight.quant_map"], np.float32).reshape(16)
    table, step = level_codes(levels)
    index = np.empty((packed.size, 2), np.uint8)
    np.right_shift(packed, 4, out=index[:, 0])
    np.bitwise_and(packed, 15, out=index[:, 1])
    codes = map_codes(table, index.reshape(rows, cols))
    scale = (absmax * np.float32(step)).reshape(rows, cols // block)
    kind = state.get("quant_type", key.rsplit("__", 1)[-1])
    _note(kind, levels, table, step)
    return AffineWeight(codes, scale, -128 * scale, 8, block, f"bitsandbytes {kind}")


def level_codes(levels: np.ndarray) -> tuple[np.ndarray, float]:
    """(uint8 code of each of the 16 levels, the step): code - 128 = round(level / step), step = the
    largest |level| / 127, so code * step - 128 * step is each level to within step / 2."""
    step = float(np.abs(levels).max()) / 127.0 or 1.0
    return (np.rint(levels / step) + 128).astype(np.uint8), step


def _absmax(t: dict[str, np.ndarray], state: dict[str, Any], blocks: int) -> np.ndarray:
    stored = np.asarray(t["weight.absmax"]).reshape(-1)
    if "weight.nested_absmax" not in t:
        return stored.astype(np.float32)[:blocks]
    nested_block = int(state["nested_blocksize"])
    outer = np.asarray(t["weight.nested_absmax"], np.float32).reshape(-1)
    table = np.asarray(t["weight.nested_quant_map"], np.float32).reshape(-1)
    value = table[stored.astype(np.intp)] * np.repeat(outer, nested_block)[: stored.size]
    return (value + np.float32(state["nested_offset"])).astype(np.float32)[:blocks]


def _note(kind: str, levels: np.ndarray, table: np.ndarray, step: float) -> None:
    if kind in _noted:
        return
    _noted.add(kind)
    off = float(np.abs((table.astype(np.float32) - 128) * step - levels).max() / np.abs(levels).max())
    logger.warning(
        "bitsandbytes %s: its 16 levels are held as 8-bit codes per block (no integer code holds them exactly): "
        "each level off by up to %.2e of its block's absmax",
        kind,
        off,
    )
