"""Load any checkpoint the weight stream reads into the MLX model, keeping quantized weights
quantized (backends/mlx/quant.py): GGUF blocks, MLX-community folders, AWQ, GPTQ, `--isq`.
FP8 weights are dequantized to the model dtype (MLX has no e4m3 matmul), said once in the log.

Mixture-of-experts checkpoints store each expert's projections separately; they are stacked into
the [E, out, in] arrays of backends/mlx/moe.py as the last expert of a projection arrives (quantized
experts as stacked packed codes for gather_qmm).
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.family_moe import expert_part, is_router, moe_name
from lantern.app.models.isq import MLA_FLOAT
from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight, fp8_as_affine, in_input_order
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mlx_packed import MlxPacked
from lantern.app.models.weight_stream import IsqMode, iter_weights
from lantern.backends.mlx.quant import get_module, quantized_module, set_module, to_mlx_arrays

logger = logging.getLogger(__name__)

# --isq on MLX: group 32 affine for both (Q4_1 / Q8-like accuracy; mlx_lm's default is g64).
ISQ_MODES = {"q4": IsqMode(4, 32), "q8": IsqMode(8, 32), "fp8": IsqMode(8, 32, kind="mxfp8")}  # fp8: MLX's mxfp8


def load_weights(model: nn.Module, spec: ModelSpec, dtype: mx.Dtype) -> None:
    cfg = spec.config
    isq = ISQ_MODES[spec.isq] if spec.isq else None
    errors = ErrorLog()
    arrays: list[tuple[str, mx.array]] = []
    experts = _ExpertStacker(model, cfg.moe.num_experts if cfg.moe else 0, dtype, errors)
    fp8 = 0
    for name, value in iter_weights(spec, "mlx", isq):
        if cfg.tie_word_embeddings and name.startswith("lm_head."):
            continue
        name = moe_name(name)
        if isinstance(value, Fp8Weight):  # no FP8 matmul: 8-bit affine g32 (half of bf16), else dequantized
            # (routers and latent attention's kv_b_proj, read whole, take the file's values exactly)
            exact = is_router(name) or (cfg.mla is not None and name.endswith(MLA_FLOAT))
            if exact or value.shape[1] % 32:
                fp8 += 0 if exact else 1
                value = value.dequantize()
            else:
                value, error = fp8_as_affine(value, 8, 32)
                errors.add(value.source, "8-bit g32 (requantized)", error)
        if isinstance(value, (AffineWeight, MlxPacked, MxWeight)) and is_router(name):
            value = value.dequantize()  # a few KB: routing at activation precision
        part = expert_part(name)
        if part is not None:
            arrays.extend(experts.add(part, value))
            continue
        if isinstance(value, (AffineWeight, MlxPacked, MxWeight)):
            prefix = name.rsplit(".", 1)[0]
            new, parts = quantized_module(get_module(model, prefix), value, dtype, errors)
            set_module(model, prefix, new)
            arrays.extend((f"{prefix}.{k}", v) for k, v in parts.items())
            continue
        if isinstance(value, np.ndarray):
            value = mx.array(value)
        if mx.issubdtype(value.dtype, mx.floating):
            value = value.astype(_placed_dtype(model, name, dtype))
        arrays.append((name, value))
    experts.finish()
    if fp8:
        logger.info(
            "%d FP8 weight(s) dequantized to %s: MLX has no FP8 matmul (input width no multiple of 32)", fp8, dtype
        )
    errors.report("MLX")
    model.load_weights(arrays, strict=True)
    mx.eval(model.parameters())
    finish_load = getattr(model, "finish_load", None)
    if finish_load is not None:  # the model's own last step (DeepSeek: a quantized kv_b_proj made dense)
        finish_load(dtype)


class _ExpertStacker:
    """Collects one projection's experts (float arrays, or packed quantized arrays) and stacks them
    once all E are in; the stacked module replaces the float ExpertLinear where they are quantized."""

    def __init__(self, model: nn.Module, num_experts: int, dtype: mx.Dtype, errors: ErrorLog):
        self.model, self.num_experts, self.dtype, self.errors = model, num_experts, dtype, errors
        self.pending: dict[str, dict[int, Any]] = {}

    def add(self, part: tuple[str, int, str, str], value: Any) -> list[tuple[str, mx.array]]:
        path, index, proj, kind = part
        if kind != "weight":
            raise ValueError(f"{path}.{index}.{proj}.{kind}: expert biases are not implemented")
        if not 0 <= index < self.num_experts:
            raise ValueError(f"{path}.{index}.{proj}: the config has {self.num_experts} experts")
        try:
            experts = get_module(self.model, path)
        except (AttributeError, IndexError, KeyError):  # no such layer: the strict load names the tensor
            experts = None
        if experts is not None and not hasattr(experts, proj):  # e.g. a gate for Nemotron 3's ungated experts
            what = proj.removesuffix("_proj")
            raise ValueError(f"{path}.{index}.{proj}: this model's experts have no {what} projection")
        if isinstance(value, MxWeight):  # as stored: gather_qmm takes the microscaled modes
            packed, scales = mx.array(value.packed), mx.array(value.scales)
            glob = mx.array(value.global_scale, dtype=mx.float32) if value.global_scale != 1.0 else None
            item: Any = ("q", packed, scales, None, value.bits, value.group_size, value.mode, glob)
        elif isinstance(value, (AffineWeight, MlxPacked)):
            if isinstance(value, AffineWeight) and value.act_bits is not None:
                raise ValueError(f"{path}.{index}.{proj}: experts whose input is quantized are not implemented")
            # gather_qmm takes no per-expert input permutation: act-order experts in input order.
            if isinstance(value, AffineWeight):  # (an MLX folder's MlxPacked has no permutation)
                value = in_input_order(value, self.errors, "stacked experts")
            # Packed now: the unpacked codes (one byte per weight) are not kept for the whole layer.
            packed, scales, biases, bits, group = to_mlx_arrays(value, self.dtype, self.errors)
            mx.eval(packed, scales, biases)
            item = ("q", packed, scales, biases, bits, group, "affine", None)
        else:
            array = mx.array(value) if isinstance(value, np.ndarray) else value
            item = array.astype(self.dtype)
            mx.eval(item)
        slot = self.pending.setdefault(f"{path}.{proj}", {})
        slot[index] = item
        if len(slot) < self.num_experts:
            return []
        del self.pending[f"{path}.{proj}"]
        return self.stack(f"{path}.{proj}", [slot.pop(i) for i in range(self.num_experts)])

    def stack(self, prefix: str, items: list[Any]) -> list[tuple[str, mx.array]]:
        from lantern.backends.mlx.moe import QuantExpertLinear

        quantized = [isinstance(it, tuple) for it in items]
        if any(isinstance(it, tuple) and it[7] is not None for it in items):  # an expert without one: 1.0
            one = mx.array(1.0, dtype=mx.float32)
            items = [(*it[:7], one) if isinstance(it, tuple) and it[7] is None else it for it in items]
        # (bits, group, mode, whether a global scale): one gather_qmm layout for all E
        modes = {(*it[4:7], it[7] is not None) for it in items if isinstance(it, tuple)}
        if all(quantized) and len(modes) == 1:
            bits, group, mode, glob = modes.pop()
            old = get_module(self.model, prefix)
            e, rows, cols = old.weight.shape
            # gpt-oss's experts keep their per-expert bias (filled from its stacked `..._bias` tensors).
            layer = QuantExpertLinear(e, cols, rows, bits, group, mode, bias="bias" in old, global_scale=glob)
            set_module(self.model, prefix, layer)
            stacked = [(f"{prefix}.{name}", [it[i] for it in items]) for name, i in _Q_NAMES.items()]
            return [(name, mx.stack(arrays)) for name, arrays in stacked if arrays[0] is not None]
        if any(quantized):  # mixed modes across experts: no single gather_qmm layout
            self.errors.note(f"{prefix}: experts quantized in different modes (or partly); dequantized to float")
        floats = [_dequantized(it) if isinstance(it, tuple) else it for it in items]
        return [(f"{prefix}.weight", mx.stack(floats).astype(self.dtype))]

    def finish(self) -> None:
        if self.pending:
            prefix, got = next(iter(self.pending.items()))
            raise ValueError(f"checkpoint has only experts {sorted(got)} of {prefix} ({self.num_experts} expected)")


_Q_NAMES = {"weight": 1, "scales": 2, "biases": 3, "global_scale": 7}  # stacked array -> its place in an item


def _dequantized(item: tuple) -> mx.array:
    _, packed, scales, biases, bits, group, mode, glob = item
    w = mx.dequantize(packed, scales, biases, group_size=group, bits=bits, mode=mode, dtype=mx.float32)
    return w if glob is None else w * glob


def _placed_dtype(model: Any, name: str, dtype: Any) -> Any:
    """float32 for the tensors of routers that keep it (DeepSeek's: models/deepseek.Router) and for a gated
    delta net's A_log (as its checkpoints store it) and a sparse-attention indexer's head weights (transformers keeps
    them so), else dtype."""
    if name.endswith((".linear_attn.A_log", ".mamba.A_log", ".indexer.weights_proj.weight")) or (
        name.endswith((".self_attn.A_log", ".self_attn.dt_bias"))  # (Kimi Linear's KDA keeps both in float32)
    ):
        return mx.float32
    if not name.endswith((".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")):
        return dtype
    try:
        router = get_module(model, name.rsplit(".", 1)[0])
    except (AttributeError, IndexError, KeyError):  # no such module: the strict load names the tensor
        return dtype
    return mx.float32 if getattr(router, "keep_float32", False) else dtype
