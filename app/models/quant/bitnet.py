"""BitNet b1.58 folders (`quant_method: "bitnet"`: microsoft/bitnet-b1.58-2B-4T and its -bf16 masters, the
HF1BitLLM Llama 3 8B 1.58) read into the shared affine form: ternary weights held as 2-bit codes, exactly, with
the 8-bit per-token activation quantization the models were trained with (AffineWeight.act_bits).

Storage facts (transformers' integrations/bitnet.py; the code is Lantern's own):
- `linear_class: "bitlinear"` (the default; the 2B4T release, HF1BitLLM): `weight` uint8 [out / 4, in] packs
  four ternary values per byte, value + 1 in 2 bits: bits 2i..2i+1 of stored row r hold output row
  i * (out / 4) + r; `weight_scale` [1] is the inverse of the weights' scale: W = ternary / weight_scale.
- `linear_class: "autobitlinear"`, `quantization_mode: "offline"`: `weight` packed as above (or the ternary
  values themselves in float), W = ternary * weight_scale.
- `autobitlinear` with `quantization_mode: "online"` (the -bf16 masters): float weights, ternarized at every
  forward pass with the absmean rule: s = mean(|W|) over the whole tensor, W = clamp(round(W / s), -1, 1) * s.
  Done once here, at load, exactly as that forward pass does it.
Every BitLinear quantizes its input per token first: x -> round(x * 127 / max|x|) (clamped to [-128, 127]),
times max|x| / 127, which the backends' quantized layers apply where act_bits says so. `use_rms_norm` (an
RMSNorm inside each linear) is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.hf_formats import QuantScheme, _not_converted, _refuse

ACT_BITS = 8  # BitNet b1.58's activations: W1.58A8
_CLASSES = ("bitlinear", "autobitlinear")
_MODES = ("offline", "online")
# the linear layers transformers' replace_with_bitnet_linear turns into BitLinears in the families that ship
# BitNet weights (BitNet, Llama): the attention's and the MLP's projections
_LINEAR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")


def parse(q: dict[str, Any]) -> QuantScheme:
    """The QuantScheme of a bitnet quantization_config ("bitnet": packed or ternary weights with their
    weight_scale; "bitnet-online": float masters ternarized at load)."""
    linear = str(q.get("linear_class", "bitlinear")).lower()
    mode = str(q.get("quantization_mode", "offline")).lower()
    if linear not in _CLASSES:
        raise _refuse("quantization_config.linear_class", linear, " for bitnet (bitlinear or autobitlinear)")
    if mode not in _MODES:
        raise _refuse("quantization_config.quantization_mode", mode, " for bitnet (offline or online)")
    if mode == "online" and linear != "autobitlinear":  # (transformers' BitLinear has no online mode)
        raise _refuse("quantization_config.quantization_mode", mode, " for bitnet's bitlinear class")
    if q.get("use_rms_norm"):
        raise _refuse("quantization_config.use_rms_norm", q["use_rms_norm"], " for bitnet (an RMSNorm in each linear)")
    method = "bitnet-online" if mode == "online" else "bitnet"
    return QuantScheme(method, 2, 0, checkpoint_format=f"{linear} {mode}", modules_to_not_convert=_not_converted(q))


def online_module_names(scheme: QuantScheme, tensor_names: list[str]) -> dict[str, list[str]]:
    """prefix -> [its weight] for every float master weight the online mode ternarizes (the projections;
    never the embedding or head, nor what modules_to_not_convert names)."""
    skip = scheme.modules_to_not_convert
    out: dict[str, list[str]] = {}
    for name in tensor_names:
        if _LINEAR.search(name) is None:
            continue
        prefix = name.removesuffix(".weight")
        if not any(prefix == s or prefix.endswith("." + s) or prefix.startswith(s + ".") for s in skip):
            out[prefix] = [name]
    return out


def read(scheme: QuantScheme, prefix: str, t: dict[str, np.ndarray]) -> AffineWeight:
    """One BitLinear's weight as 2-bit codes (ternary + 1) with one scale per row, its input quantized per token."""
    linear = scheme.checkpoint_format.split()[0]
    weight = np.asarray(t["weight"])
    if scheme.method == "bitnet-online":
        return _absmean(np.asarray(weight, np.float32))
    factor = np.asarray(t["weight_scale"], np.float32).ravel()
    if weight.dtype == np.uint8:
        codes = unpack_ternary(weight)
    elif linear == "autobitlinear":  # (transformers multiplies whatever floats it finds: ternary ones expected)
        values = np.asarray(weight, np.float32)
        codes = (values + 1).astype(np.uint8)
        if not np.array_equal(codes.astype(np.float32) - 1, values) or codes.max(initial=0) > 2:
            raise ValueError(f"{prefix}.weight holds values other than -1, 0, 1 for an offline autobitlinear layer")
    else:
        raise ValueError(f"{prefix}.weight is {weight.dtype}; bitlinear weights are packed uint8")
    rows = codes.shape[0]
    if factor.size not in (1, rows):
        raise ValueError(f"{prefix}.weight_scale has {factor.size} values for {rows} output rows")
    step = (1.0 / factor if linear == "bitlinear" else factor).astype(np.float32)
    scales = np.ascontiguousarray(np.broadcast_to(step.reshape(-1, 1), (rows, 1)))
    return AffineWeight(codes, scales, -scales, 2, codes.shape[1], scheme.label, act_bits=ACT_BITS)


def unpack_ternary(packed: np.ndarray) -> np.ndarray:
    """uint8 [out / 4, in] -> codes uint8 [out, in] (ternary + 1): bits 2i..2i+1 of stored row r are row
    i * (out / 4) + r."""
    packed = np.ascontiguousarray(packed, np.uint8)
    if packed.ndim != 2:
        raise ValueError(f"packed BitNet weights are 2-D, not {packed.shape}")
    return np.concatenate([(packed >> np.uint8(2 * i)) & np.uint8(3) for i in range(4)])


def _absmean(w: np.ndarray) -> AffineWeight:
    """The online mode's ternarization as its forward pass computes it in float32: k = 1 / mean(|W|) (at most
    1e5), codes round(W * k) clamped to -1..1, values code / k."""
    k = np.float32(1.0) / np.float32(max(float(np.abs(w).mean(dtype=np.float32)), 1e-5))
    codes = (np.clip(np.rint(w * k), -1, 1) + 1).astype(np.uint8)
    scales = np.full((w.shape[0], 1), np.float32(1.0) / k, np.float32)
    return AffineWeight(codes, scales, -scales, 2, w.shape[1], "BitNet ternary (online masters)", act_bits=ACT_BITS)
