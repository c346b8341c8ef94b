"""Load HF safetensors folders and GGUF files (dequantized) into the torch model."""

from __future__ import annotations

import warnings

import torch
from safetensors.torch import load_file

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.gguf_names import read_gguf_dequantized
from lantern.backends.torch.parallel import TPGroup, fuse_projections, shard_weights


def load_weights(model: torch.nn.Module, spec: ModelSpec, tp: TPGroup = TPGroup()) -> None:
    """Copy the checkpoint into the model's (already allocated, right dtype and device) tensors."""
    cfg = spec.config
    if cfg.quantization:
        raise ValueError("MLX-quantized folders need the mlx backend; the torch backend loads float weights")
    if spec.weight_format == "gguf":
        arrays = read_gguf_dequantized(str(spec.weight_files[0]), cfg.num_heads, cfg.num_kv_heads)
        with warnings.catch_warnings():  # read-only mmaps: fine, they are only read from
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            weights = {k: torch.from_numpy(v) for k, v in arrays.items()}
    else:
        weights = {}
        for f in spec.weight_files:
            weights.update(load_file(str(f)))
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    weights = fuse_projections(shard_weights(weights, cfg, tp))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
