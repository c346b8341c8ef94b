"""Stream any checkpoint into the torch model, one tensor at a time, quantized weights kept quantized.

The model is built on the meta device; each float tensor becomes its parameter on the target
device as it arrives, and each quantized one (AffineWeight / Fp8Weight) replaces its nn.Linear or
nn.Embedding with a layer from quant_linear.py. q/k/v and gate/up arrive separately and are
stacked into the fused qkv_proj / gate_up_proj once all parts are in (as one quantized matrix when
the parts share a mode, else as a stack of layers: GGUF Q4_K_M mixes Q4_K and Q6_K). Tensor
parallelism slices every tensor before it is placed, quantized ones along whole groups.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight, concat_rows
from lantern.app.models.weight_stream import IsqMode, iter_weights
from lantern.backends.torch.parallel import COLUMN_PARALLEL, ROW_PARALLEL, TPGroup, vocab_shard

logger = logging.getLogger(__name__)

_FUSED = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}


def isq_mode(scheme: str | None, device: torch.device) -> IsqMode | None:
    """--isq layouts the kernels take exactly: on CPU int4 g32 (aten int4pack) and per-channel
    symmetric int8 (aten int8pack); on CUDA the Triton kernels' 4- and 8-bit g64."""
    if scheme is None:
        return None
    if device.type == "cpu":
        return IsqMode(4, 32) if scheme == "q4" else IsqMode(8, 0, symmetric=True)
    return IsqMode(4 if scheme == "q4" else 8, 64)


class FloatLinear(nn.Module):
    """A float weight as one part of a stacked projection whose other parts are quantized."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class BiasAdded(nn.Module):
    """A quantized projection plus its float bias (Qwen2's q/k/v), added in the activation dtype."""

    def __init__(self, inner: nn.Module, bias: torch.Tensor):
        super().__init__()
        self.inner = inner
        self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.bias.to(x.dtype)


class _Loader:
    def __init__(self, model: nn.Module, spec: ModelSpec, tp: TPGroup, device: torch.device, dtype: torch.dtype):
        self.model, self.cfg, self.tp, self.device, self.dtype = model, spec.config, tp, device, dtype
        self.errors = ErrorLog()
        self.parts: dict[tuple[str, str], dict[int, Any]] = {}
        self.quantized: set[str] = set()
        self.fp8 = False

    # ---- tensor parallel slicing ---------------------------------------------------------
    def shard(self, prefix: str, kind: str, value: Any) -> Any:
        if not self.tp.active:
            return value
        module = prefix.rsplit(".", 1)[-1]
        rows = value.shape[0]
        if module in COLUMN_PARALLEL:
            per = rows // self.tp.world
            return _rows(value, self.tp.rank * per, (self.tp.rank + 1) * per)
        if module in ROW_PARALLEL and kind == "weight":
            per = value.shape[1] // self.tp.world
            start, end = self.tp.rank * per, (self.tp.rank + 1) * per
            if isinstance(value, Fp8Weight):
                try:
                    return value.cols(start, end)
                except ValueError as exc:  # a shard cuts the scale blocks
                    logger.info("%s; dequantized for tensor parallelism", exc)
                    value = _as_torch(value.dequantize())
            if isinstance(value, AffineWeight):
                return value.cols(start, end)
            return _as_torch(value)[:, start:end]
        if prefix in ("model.embed_tokens", "lm_head"):
            start, end, per = vocab_shard(self.cfg.vocab_size, self.tp)
            return _pad_rows(_rows(value, start, end), per)
        return value

    # ---- placing -------------------------------------------------------------------------
    def add(self, name: str, value: Any) -> None:
        prefix, kind = name.rsplit(".", 1)
        value = self.shard(prefix, kind, value)
        parent, module = prefix.rsplit(".", 1) if "." in prefix else ("", prefix)
        if module in _FUSED:
            fused, index, count = _FUSED[module]
            slot = self.parts.setdefault((f"{parent}.{fused}", kind), {})
            slot[index] = value
            if len(slot) == count:
                del self.parts[(f"{parent}.{fused}", kind)]
                self.place(f"{parent}.{fused}", kind, [slot[i] for i in range(count)])
            return
        self.place(prefix, kind, [value])

    def place(self, path: str, kind: str, parts: list[Any]) -> None:
        if kind == "bias" and path in self.quantized:
            bias = torch.cat([_as_torch(p) for p in parts]).to(self.device, self.dtype)
            _set_module(self.model, path, BiasAdded(self.model.get_submodule(path), bias))
            return
        if path.endswith("embed_tokens") and isinstance(parts[0], Fp8Weight):
            self.fp8 = True  # no FP8 gather: the table is float (an FP8 embedding is rare)
            parts = [_as_torch(parts[0].dequantize())]
        if any(isinstance(p, (AffineWeight, Fp8Weight)) for p in parts):
            if kind != "weight":
                raise ValueError(f"{path}.{kind}: only weights can be quantized")
            expected = tuple(self.model.get_submodule(path).weight.shape)
            got = (sum(p.shape[0] for p in parts), parts[0].shape[1])
            if got != expected:
                raise ValueError(f"{path}.weight has shape {got}, the model expects {expected}")
            layer = self.quantized_layer(path, parts)
            bias = getattr(self.model.get_submodule(path), "bias", None)
            if isinstance(bias, torch.Tensor) and not bias.is_meta:  # the bias came first (names sort so)
                layer = BiasAdded(layer, bias.detach())
            _set_module(self.model, path, layer)
            self.quantized.add(path)
            return
        tensor = parts[0] if len(parts) == 1 else torch.cat([_as_torch(p) for p in parts])
        module = self.model.get_submodule(path)
        if kind not in module._parameters:
            raise ValueError(f"unexpected weight {path}.{kind} for this architecture")
        expected = module._parameters[kind].shape
        tensor = _as_torch(tensor)
        if tuple(tensor.shape) != tuple(expected):
            raise ValueError(f"{path}.{kind} has shape {tuple(tensor.shape)}, the model expects {tuple(expected)}")
        module._parameters[kind] = nn.Parameter(tensor.to(self.device, self.dtype), requires_grad=False)

    def quantized_layer(self, path: str, parts: list[Any]) -> nn.Module:
        from lantern.backends.torch.quant_linear import quantized_embedding, quantized_linear, stacked_linear

        if path.endswith("embed_tokens"):
            return quantized_embedding(parts[0], self.device, self.dtype, self.errors)
        if all(isinstance(p, AffineWeight) for p in parts) and len({p.mode for p in parts}) == 1:
            return quantized_linear(concat_rows(parts), None, self.device, self.dtype, self.errors)
        layers: list[nn.Module] = []
        for p in parts:
            if isinstance(p, (AffineWeight, Fp8Weight)):
                layers.append(quantized_linear(p, None, self.device, self.dtype, self.errors))
            else:
                layers.append(FloatLinear(_as_torch(p).to(self.device, self.dtype)))
        return layers[0] if len(layers) == 1 else stacked_linear(layers)

    def finish(self) -> None:
        if self.parts:
            (path, kind), got = next(iter(self.parts.items()))
            raise ValueError(f"checkpoint has only part of {path}.{kind} (parts {sorted(got)})")
        missing = [n for n, p in self.model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"weights do not match the model: missing {missing[:5]}")
        if self.fp8:  # FP8 projections say what they do in quant_linear
            logger.info("the FP8 embedding table is dequantized to %s", self.dtype)
        self.errors.report("torch")


def load_weights(model: nn.Module, spec: ModelSpec, tp: TPGroup, device: torch.device, dtype: torch.dtype) -> None:
    """Fill a meta-device model from the checkpoint."""
    loader = _Loader(model, spec, tp, device, dtype)
    tied = spec.config.tie_word_embeddings
    with warnings.catch_warnings():  # read-only mmaps: fine, they are only read from
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, value in iter_weights(spec, "pt", isq_mode(spec.isq, device)):
            if tied and name.startswith("lm_head."):
                continue
            loader.add(name, value)
            del value  # not alive while the next tensor converts
    loader.finish()


def _as_torch(value: Any) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return value


def _rows(value: Any, start: int, end: int) -> Any:
    if isinstance(value, Fp8Weight):
        try:
            return value.rows(start, end)
        except ValueError as exc:  # a shard cuts the scale blocks
            logger.info("%s; dequantized for tensor parallelism", exc)
            return _as_torch(value.dequantize())[start:end]
    if isinstance(value, AffineWeight):
        return value.rows(start, end)
    return _as_torch(value)[start:end]


def _pad_rows(value: Any, rows: int) -> Any:
    have = value.shape[0]
    if have == rows:
        return value
    if isinstance(value, AffineWeight):
        pad = rows - have
        return AffineWeight(
            np.concatenate([value.codes, np.zeros((pad, value.codes.shape[1]), np.uint8)]),
            np.concatenate([value.scales, np.zeros((pad, value.scales.shape[1]), np.float32)]),
            np.concatenate([value.biases, np.zeros((pad, value.biases.shape[1]), np.float32)]),
            value.bits,
            value.group_size,
            value.source,
        )
    shard = torch.zeros(rows, value.shape[1], dtype=value.dtype)
    shard[:have] = value
    return shard


def _set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, new)
