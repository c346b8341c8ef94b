"""Arcee AFM decoder in torch over a flattened token batch (maths in app/models/family_arcee.py; the MLX file
has the same layout): Llama's decoder layer with Nemotron's ungated relu^2 MLP (models/nemotron_h.Relu2MLP).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.nemotron_h import Relu2MLP
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, mlp=Relu2MLP(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
