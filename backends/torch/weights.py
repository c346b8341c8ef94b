"""Stream any checkpoint into the torch model, one tensor at a time, quantized weights kept quantized.

The model is built on the meta device; each float tensor becomes its parameter on the target
device as it arrives, and each quantized one (AffineWeight / Fp8Weight) replaces its nn.Linear or
nn.Embedding with a layer from quant_linear.py. q/k/v and gate/up arrive separately and are
stacked into the fused qkv_proj / gate_up_proj once all parts are in (as one quantized matrix when
the parts share a mode and act-order permutation, else as a stack of layers: GGUF Q4_K_M mixes Q4_K
and Q6_K). Tensor
parallelism slices every tensor before it is placed, quantized ones along whole groups.

Mixture-of-experts checkpoints store each expert's projections separately (Mixtral's w1/w3/w2 are
renamed by family_moe.moe_name): float experts are copied into the stacked [E, out, in] parameters
of moe.StackedExperts as they arrive (allocated once, at the first expert); quantized ones become one
quantized layer per expert and projection (moe.QuantExperts), gate and up fused like gate_up_proj.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.family_moe import expert_part, is_router, moe_name
from lantern.app.models.quant.affine import (
    AffineWeight,
    ErrorLog,
    Fp8Weight,
    concat_fp8_rows,
    concat_rows,
    in_input_order,
    same_perm,
)
from lantern.app.models.weight_stream import IsqMode, iter_weights
from lantern.backends.torch.parallel import COLUMN_PARALLEL, ROW_PARALLEL, TPGroup, vocab_shard
from lantern.backends.torch.quant_linear import INT8PACK_COLS

logger = logging.getLogger(__name__)

# Tables looked up by id (Gemma 4's per-layer one; an encoder's words, positions and token types).
EMBEDDINGS = (
    "embed_tokens",
    "embed_tokens_per_layer",
    "word_embeddings",
    "position_embeddings",
    "token_type_embeddings",
    "tok_embeddings",
)
_FUSED = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}


def isq_mode(scheme: str | None, device: torch.device) -> IsqMode | None:
    """--isq layouts the kernels take exactly: on CPU int4 g32 (aten int4pack) and per-channel
    symmetric int8 (aten int8pack, whose input width must be a multiple of 16: narrower or ragged
    matrices stay in float); on CUDA the Triton kernels' 4- and 8-bit g64, and fp8 (e4m3, a scale per
    row: torch._scaled_mm from compute capability 8.9, the Triton e4m3 kernels before; refused on a
    CPU, naming q8)."""
    if scheme is None:
        return None
    if scheme == "fp8":  # e4m3 with a scale per row: torch._scaled_mm on FP8 GPUs, the Triton e4m3 kernels before
        if device.type != "cuda":
            raise ValueError(
                "--isq fp8 needs a CUDA GPU (FP8 matmuls from compute capability 8.9, FP8 weights through the "
                "Triton kernels before): on a CPU its weights would only be dequantized; use --isq q8 (8-bit "
                "weights computed as stored)"
            )
        return IsqMode(8, 0, symmetric=True, col_multiple=32, kind="fp8")
    if device.type == "cpu":
        return IsqMode(4, 32) if scheme == "q4" else IsqMode(8, 0, symmetric=True, col_multiple=INT8PACK_COLS)
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
        self.experts_placed: dict[str, set[tuple[int, str]]] = {}  # stacked float experts filled so far
        self.expert_shapes: dict[str, tuple[int, int, int]] = {}  # quantized experts: (E, hidden, inner)

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
            if isinstance(value, AffineWeight):  # act-order columns are scattered: put in input order
                return in_input_order(value, self.errors, "tensor-parallel split").cols(start, end)
            return _as_torch(value)[:, start:end]
        if prefix in ("model.embed_tokens", "lm_head"):
            start, end, per = vocab_shard(self.cfg.vocab_size, self.tp)
            return _pad_rows(_rows(value, start, end), per)
        return value

    # ---- placing -------------------------------------------------------------------------
    def add(self, name: str, value: Any) -> None:
        name = moe_name(name)
        if isinstance(value, (AffineWeight, Fp8Weight)) and is_router(name):
            value = value.dequantize()  # a few KB: the experts are chosen at activation precision
        part = expert_part(name)
        if part is not None:
            self.add_expert(*part, value)
            return
        prefix, kind = name.rsplit(".", 1)
        value = self.shard(prefix, kind, value)
        parent, module = prefix.rsplit(".", 1) if "." in prefix else ("", prefix)
        if module in _FUSED and hasattr(self.model.get_submodule(parent), _FUSED[module][0]):
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
        if path.endswith(EMBEDDINGS) and isinstance(parts[0], Fp8Weight):
            self.fp8 = True  # no FP8 gather: the table is float (an FP8 embedding is rare)
            parts = [_as_torch(parts[0].dequantize())]
        if kind == "weight" and path.endswith(".kv_b_proj") and _densified(self.model, path):
            # Latent attention reads this matrix densely (models/deepseek.MLAttention.dense_kv_b): take
            # the file's values exactly, not a requantized int8 layout decoded back.
            parts = [_as_torch(p.dequantize()) if isinstance(p, (AffineWeight, Fp8Weight)) else p for p in parts]
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
        keep = getattr(module, "keep_float32", False)  # True: all of it (DeepSeek's routers), or some names
        dtype = torch.float32 if keep is True or (isinstance(keep, tuple) and kind in keep) else self.dtype
        module._parameters[kind] = nn.Parameter(tensor.to(self.device, dtype), requires_grad=False)

    def quantized_layer(self, path: str, parts: list[Any], expert: bool = False) -> nn.Module:
        """One layer over the parts (stacked rows); `expert`: a MoE expert's projection, which on CUDA
        takes the Triton kernels where it can, so that the layer's experts stack for the fused kernel."""
        from lantern.backends.torch.quant_linear import quantized_embedding, quantized_linear, stacked_linear
        from lantern.backends.torch.triton_linear import fp8_groups

        if path.endswith(EMBEDDINGS):
            return quantized_embedding(parts[0], self.device, self.dtype, self.errors)
        if all(isinstance(p, AffineWeight) for p in parts) and len({p.mode for p in parts}) == 1 and same_perm(parts):
            return quantized_linear(concat_rows(parts), None, self.device, self.dtype, self.errors)
        joined = concat_fp8_rows(parts) if all(isinstance(p, Fp8Weight) for p in parts) else None
        if joined is not None:
            kernel = "triton" if expert and self.device.type == "cuda" and fp8_groups(joined) is not None else None
            return quantized_linear(joined, None, self.device, self.dtype, self.errors, kernel=kernel)
        layers: list[nn.Module] = []
        for p in parts:
            if isinstance(p, (AffineWeight, Fp8Weight)):
                layers.append(quantized_linear(p, None, self.device, self.dtype, self.errors))
            else:
                layers.append(FloatLinear(_as_torch(p).to(self.device, self.dtype)))
        return layers[0] if len(layers) == 1 else stacked_linear(layers)

    # ---- mixture-of-experts ------------------------------------------------------------------
    def add_expert(self, path: str, index: int, proj: str, kind: str, value: Any) -> None:
        from lantern.backends.torch.moe import BiasedExperts, QuantExperts, StackedExperts

        if kind != "weight":
            raise ValueError(f"{path}.{index}.{proj}.{kind}: expert biases are not implemented")
        if isinstance(value, AffineWeight) and value.act_bits is not None:
            raise ValueError(f"{path}.{index}.{proj}: experts whose input is quantized are not implemented")
        module = self.model.get_submodule(path)
        # gpt-oss (BiasedExperts): quantized experts arrive one by one (MXFP4 repacked, --isq), biases stacked.
        stacked = isinstance(module, (StackedExperts, BiasedExperts))
        num_experts, _, hidden = module.gate_up_proj.shape if stacked else (0, 0, 0)
        quantized = isinstance(value, (AffineWeight, Fp8Weight))
        if stacked and quantized:
            if path not in self.experts_placed:  # the layer's first expert: keep them quantized
                inner = module.down_proj.shape[2]
                self.expert_shapes[path] = (num_experts, hidden, inner)
                module = QuantExperts.replacing(module)
                _set_module(self.model, path, module)
            else:
                self.errors.note(f"{path}: experts partly quantized, partly float; dequantized to {self.dtype}")
                value = value.dequantize()
        if stacked and not isinstance(module, QuantExperts):
            self.place_float_expert(path, module, index, proj, value)
            return
        num_experts, hidden, inner = self.expert_shapes[path]
        if not 0 <= index < num_experts:
            raise ValueError(f"{path}.{index}: the config has {num_experts} experts")
        if proj == "gate_proj" and not module.gated:
            raise ValueError(f"{path}.{index}.gate_proj: this model's experts have no gate projection")
        expected = (hidden, inner) if proj == "down_proj" else (inner, hidden)
        if tuple(value.shape) != expected:
            raise ValueError(f"{path}.{index}.{proj}.weight has shape {tuple(value.shape)}, expected {expected}")
        if proj == "down_proj":
            module.down_proj[index] = self.quantized_layer(f"{path}.{index}.down_proj", [value], expert=True)
            return
        slot = self.parts.setdefault((f"{path}.{index}.gate_up_proj", kind), {})
        slot[0 if proj == "gate_proj" else 1] = value
        if len(slot) == 1 + module.gated:  # ungated experts: up alone
            del self.parts[(f"{path}.{index}.gate_up_proj", kind)]
            parts = [slot[i] for i in sorted(slot)]
            module.gate_up_proj[index] = self.quantized_layer(f"{path}.{index}.gate_up_proj", parts, expert=True)

    def place_float_expert(self, path: str, module: nn.Module, index: int, proj: str, value: Any) -> None:
        which = "down_proj" if proj == "down_proj" else "gate_up_proj"
        param = module._parameters[which]
        if param.is_meta:  # allocated once, at the first expert: filled in place as the rest arrive
            param = nn.Parameter(torch.empty(param.shape, device=self.device, dtype=self.dtype), requires_grad=False)
            module._parameters[which] = param
        if not 0 <= index < param.shape[0]:
            raise ValueError(f"{path}.{index}: the config has {param.shape[0]} experts")
        inner = module.down_proj.shape[2]
        if proj == "gate_proj" and not module.gated:
            raise ValueError(f"{path}.{index}.gate_proj: this model's experts have no gate projection")
        up = slice(inner, 2 * inner) if module.gated else slice(0, inner)
        rows = {"gate_proj": slice(0, inner), "up_proj": up, "down_proj": slice(None)}[proj]
        target = param.data[index, rows]
        tensor = _as_torch(value)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"{path}.{index}.{proj}.weight has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(tensor)
        self.experts_placed.setdefault(path, set()).add((index, proj))

    def check_experts(self) -> None:
        from lantern.backends.torch.moe import QuantExperts, StackedExperts, Unset

        for path, module in self.model.named_modules():
            if isinstance(module, StackedExperts):
                placed = self.experts_placed.get(path, set())
                if len(placed) != (2 + module.gated) * module.gate_up_proj.shape[0]:
                    raise ValueError(f"checkpoint has {len(placed)} of the {path} expert projections")
            elif isinstance(module, QuantExperts):
                missing = [i for i, m in enumerate(module.down_proj) if isinstance(m, Unset)]
                missing += [i for i, m in enumerate(module.gate_up_proj) if isinstance(m, Unset)]
                if missing:
                    raise ValueError(f"checkpoint lacks {path} experts {sorted(set(missing))[:5]}")
                if self.device.type == "cuda":
                    module.stack_for_cuda()

    def finish(self) -> None:
        self.check_experts()
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
            try:
                loader.add(name, value)
            except AttributeError as exc:  # get_submodule: the model has no module of that name
                arch = spec.config.architecture
                raise ValueError(f"unexpected weight {name} for this {arch} model ({exc})") from None
            del value  # not alive while the next tensor converts
    loader.finish()
    finish_load = getattr(model, "finish_load", None)
    if finish_load is not None:  # the model's own last step (DeepSeek: a quantized kv_b_proj made dense)
        finish_load(dtype)


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
        return replace(
            value,
            codes=np.concatenate([value.codes, np.zeros((pad, value.codes.shape[1]), np.uint8)]),
            scales=np.concatenate([value.scales, np.zeros((pad, value.scales.shape[1]), np.float32)]),
            biases=np.concatenate([value.biases, np.zeros((pad, value.biases.shape[1]), np.float32)]),
        )
    if isinstance(value, Fp8Weight):  # zero bytes are 0.0; their scales 1 (per row) or one more block row
        pad = rows - have
        scale = np.asarray(value.scale, np.float32)
        if value.block is not None:
            extra = -(-rows // value.block[0]) - scale.shape[0]
            scale = np.concatenate([scale, np.ones((extra, scale.shape[1]), np.float32)])
        elif scale.size == have:
            scale = np.concatenate([scale.reshape(have, 1), np.ones((pad, 1), np.float32)])
        data = np.concatenate([value.data, np.zeros((pad, value.data.shape[1]), np.uint8)])
        return Fp8Weight(data, scale, value.block, value.source)
    shard = torch.zeros(rows, value.shape[1], dtype=value.dtype)
    shard[:have] = value
    return shard


def _densified(model: nn.Module, path: str) -> bool:
    """True when the module owning `path` makes it a dense matrix after loading (dense_kv_b)."""
    return hasattr(model.get_submodule(path.rsplit(".", 1)[0]), "dense_kv_b")


def _set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, new)
