"""Arcee AFM decoder in MLX over a flattened token batch (maths in app/models/family_arcee.py; the torch file
has the same layout): Llama's decoder layer with Nemotron's ungated relu^2 MLP (models/nemotron_h.Relu2MLP).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.nemotron_h import Relu2MLP


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, mlp=Relu2MLP(cfg))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
