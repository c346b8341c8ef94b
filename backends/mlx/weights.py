"""Load HF safetensors folders and GGUF files into the MLX model.

GGUF Q4_0/Q4_1/Q8_0 tensors stay quantized: MLX reads them as affine (group 32) triplets. Other
quantized GGUF types are dequantized with the `gguf` package's reference code, because MLX's own
reader gets some of them wrong (see PLATFORM-NOTES).
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.gguf_names import PERMUTED_ARCHITECTURES, hf_name, needs_unpermute, unpermute_rows
from lantern.app.models.spec import ModelConfig

logger = logging.getLogger(__name__)

_MLX_NATIVE_GGUF = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}


def _read_gguf(path: Path, cfg: ModelConfig) -> dict[str, mx.array]:
    import gguf

    from lantern.app.models.gguf_names import read_gguf_index

    index = read_gguf_index(str(path))  # gguf.GGUFReader parses the whole vocabulary first (seconds)
    native = mx.load(str(path))
    out: dict[str, mx.array] = {}
    for t in index.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        base = name.rsplit(".", 1)[0]
        qtype = t.tensor_type.name
        if qtype in _MLX_NATIVE_GGUF:
            out[name] = native[t.name]
            stem = t.name.rsplit(".", 1)[0]
            for part in ("scales", "biases"):
                if f"{stem}.{part}" in native:
                    out[f"{base}.{part}"] = native[f"{stem}.{part}"]
        else:
            logger.info("dequantizing %s (%s) with the gguf reference code", t.name, qtype)
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape))
            out[name] = mx.array(np.asarray(data, dtype=np.float32).reshape(shape))
    if index.architecture in PERMUTED_ARCHITECTURES:
        for name in list(out):
            which = needs_unpermute(name)
            if which:
                out[name] = unpermute_rows(out[name], cfg.num_heads if which == "q" else cfg.num_kv_heads)
    return out


def _quant_params(weights: dict[str, mx.array], prefix: str) -> dict | None:
    scales = weights.get(f"{prefix}.scales")
    if scales is None:
        return None
    w = weights[f"{prefix}.weight"]
    in_features = None
    for group_size in (32, 64, 128):
        in_features = scales.shape[-1] * group_size
        bits = w.shape[-1] * 32 // in_features
        if bits * in_features == w.shape[-1] * 32 and bits in (2, 3, 4, 5, 6, 8):
            return {"group_size": group_size, "bits": bits}
    raise ValueError(f"cannot infer quantization of {prefix}")


def load_weights(model: nn.Module, spec: ModelSpec, dtype: mx.Dtype) -> None:
    cfg = spec.config
    if spec.weight_format == "gguf":
        weights = _read_gguf(spec.weight_files[0], cfg)
    else:
        weights = {}
        for f in spec.weight_files:
            weights.update(mx.load(str(f)))
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    if cfg.quantization and spec.weight_format != "gguf":
        q = cfg.quantization
        nn.quantize(
            model,
            q["group_size"],
            q["bits"],
            class_predicate=lambda p, m: f"{p}.scales" in weights,
        )
    elif any(k.endswith(".scales") for k in weights):
        nn.quantize(model, class_predicate=lambda p, m: _quant_params(weights, p) or False)
    # Float tensors take the requested dtype; packed quantized ints stay as they are.
    cast = {}
    for k, v in weights.items():
        if mx.issubdtype(v.dtype, mx.floating):
            v = v.astype(dtype)
        cast[k] = v
    model.load_weights(list(cast.items()), strict=True)
    mx.eval(model.parameters())
