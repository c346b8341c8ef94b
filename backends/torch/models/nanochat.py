"""NanoChat decoder in torch over a flattened token batch (maths in app/models/family_nanochat.py; the MLX file has
the same layout): Llama's layer whose RMSNorms have no weight -- around the sublayers, on q and k after the rope
(which layers.Attention turns the other way: cfg.rope_reversed), on the embedding and at the end -- and Nemotron's
ungated relu^2 MLP.
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.llama4 import L2Norm as PlainRMSNorm
from lantern.backends.torch.models.nemotron_h import Relu2MLP
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        attn = Attention(cfg, layer_idx, tp, norm=PlainRMSNorm)
        super().__init__(cfg, layer_idx, tp, attn=attn, mlp=Relu2MLP(cfg, tp))
        self.input_layernorm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = PlainRMSNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.embed_norm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # (not the Backbone's LayerNorm)
