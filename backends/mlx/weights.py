"""Load any checkpoint the weight stream reads into the MLX model, keeping quantized weights
quantized (backends/mlx/quant.py): GGUF blocks, MLX-community folders, AWQ, GPTQ, `--isq`.
FP8 weights are dequantized to the model dtype (MLX has no e4m3 matmul), said once in the log.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight
from lantern.app.models.weight_stream import IsqMode, iter_weights
from lantern.backends.mlx.quant import get_module, quantized_module, set_module

logger = logging.getLogger(__name__)

# --isq on MLX: group 32 affine for both (Q4_1 / Q8-like accuracy; mlx_lm's default is g64).
ISQ_MODES = {"q4": IsqMode(4, 32), "q8": IsqMode(8, 32)}


def load_weights(model: nn.Module, spec: ModelSpec, dtype: mx.Dtype) -> None:
    cfg = spec.config
    isq = ISQ_MODES[spec.isq] if spec.isq else None
    errors = ErrorLog()
    arrays: list[tuple[str, mx.array]] = []
    fp8 = 0
    for name, value in iter_weights(spec, "mlx", isq):
        if cfg.tie_word_embeddings and name.startswith("lm_head."):
            continue
        if isinstance(value, Fp8Weight):
            fp8 += 1
            value = value.dequantize()
        if isinstance(value, AffineWeight):
            prefix = name.rsplit(".", 1)[0]
            new, parts = quantized_module(get_module(model, prefix), value, dtype, errors)
            set_module(model, prefix, new)
            arrays.extend((f"{prefix}.{k}", v) for k, v in parts.items())
            continue
        if isinstance(value, np.ndarray):
            value = mx.array(value)
        if mx.issubdtype(value.dtype, mx.floating):
            value = value.astype(dtype)
        arrays.append((name, value))
    if fp8:
        logger.info("%d FP8 weight(s) dequantized to %s: MLX has no FP8 matmul", fp8, dtype)
    errors.report("MLX")
    model.load_weights(arrays, strict=True)
    mx.eval(model.parameters())
