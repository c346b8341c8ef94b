"""sentence-transformers Dense modules: the linear layers some embedding folders apply to the pooled vector before
it is normalized (LaBSE's tanh projection, distiluse's 768 -> 512, EmbeddingGemma's pair of projections).

modules.json lists them after the Pooling module; each folder (`2_Dense/`, ...) holds config.json (in_features,
out_features, bias, activation_function) and the weights as linear.weight / linear.bias, in model.safetensors
(or pytorch_model.bin, as older folders saved them). They run on the pooled vectors in float32 on the CPU: one
[out, in] product per input, next to the model's own forward pass.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lantern.app.models.errors import UnsupportedModelError

logger = logging.getLogger(__name__)

# sentence-transformers' activation_function values (a torch class path) -> what Lantern computes
_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}


@dataclass(frozen=True)
class DenseLayer:
    weight: np.ndarray  # [out_features, in_features] float32
    bias: np.ndarray | None  # [out_features] float32
    activation: str  # "identity" or "tanh"

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        out = self.weight @ vector.astype(np.float32)
        if self.bias is not None:
            out = out + self.bias
        return np.tanh(out) if self.activation == "tanh" else out


def _weights(where: Path) -> dict[str, np.ndarray]:
    if (where / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        return load_file(str(where / "model.safetensors"))
    if (where / "pytorch_model.bin").is_file():
        try:
            import torch
        except ImportError:
            raise UnsupportedModelError(
                f"{where}/pytorch_model.bin: reading it needs torch (no model.safetensors)"
            ) from None
        state = torch.load(where / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise UnsupportedModelError(f"{where}: no model.safetensors or pytorch_model.bin for its Dense module")


def load_dense(where: Path, width: int) -> DenseLayer:
    """One Dense module's folder; `width`: the vector it receives (refused if in_features differs)."""
    cfg_file = where / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModelError(f"{cfg_file}: unreadable ({exc})") from None
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in _ACTIVATIONS:
        supported = ", ".join(_ACTIVATIONS)
        raise UnsupportedModelError(
            f"activation_function={json.dumps(act)} in {cfg_file} is not implemented; {supported}"
        )
    if int(cfg.get("in_features", width)) != width:
        raise UnsupportedModelError(f"in_features={cfg['in_features']} in {cfg_file}: the vector before it has {width}")
    tensors = _weights(where)
    weight = np.ascontiguousarray(tensors["linear.weight"], dtype=np.float32)
    bias = tensors.get("linear.bias") if cfg.get("bias", True) else None
    if weight.shape != (int(cfg.get("out_features", weight.shape[0])), width):
        raise UnsupportedModelError(f"{where}: linear.weight {weight.shape} does not match its config.json")
    return DenseLayer(weight, None if bias is None else np.asarray(bias, dtype=np.float32), _ACTIVATIONS[act])


def dense_layers(folder: Path | None, hidden_size: int) -> list[DenseLayer]:
    """The Dense modules a sentence-transformers folder applies after its pooling, in order ([] for none)."""
    if folder is None or not (folder / "modules.json").is_file():
        return []
    layers: list[DenseLayer] = []
    width = hidden_size
    for module in json.loads((folder / "modules.json").read_text()):
        if str(module.get("type", "")).rsplit(".", 1)[-1] != "Dense":
            continue
        layer = load_dense(folder / str(module.get("path", "")), width)
        layers.append(layer)
        width = layer.weight.shape[0]
    if layers:
        logger.info("sentence-transformers Dense modules: %s", " -> ".join(str(w.weight.shape[::-1]) for w in layers))
    return layers


def gguf_dense_layers(path: Path) -> list[DenseLayer]:
    """The Dense projections a GGUF file carries (EmbeddingGemma converted with
    --sentence-transformers-dense-modules: dense_2 then dense_3, no bias, identity), [] for none."""
    from lantern.app.models.gguf_names import read_gguf_index
    from lantern.app.models.quant.gguf_blocks import gguf_to_weight

    tensors = {t.name: t for t in read_gguf_index(str(path)).tensors}
    layers = []
    for name in ("dense_2.weight", "dense_3.weight"):
        t = tensors.get(name)
        if t is None:
            continue
        rows, cols = int(t.shape[1]), int(t.shape[0])  # ggml's dims: fastest-moving (input) first
        w = gguf_to_weight(t.tensor_type.name, t.data, rows, cols)
        w = w.dequantize() if hasattr(w, "dequantize") else w
        layers.append(
            DenseLayer(np.ascontiguousarray(np.asarray(w, dtype=np.float32).reshape(rows, cols)), None, "identity")
        )
    if layers:
        logger.info("GGUF Dense projections: %s", " -> ".join(str(w.weight.shape[::-1]) for w in layers))
    return layers
