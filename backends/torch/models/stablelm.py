"""StableLM decoder in torch over a flattened token batch (maths in app/models/family_stablelm.py; the MLX file has
the same layout): Llama's decoder layer under LayerNorms with biases; q/k/v biases and the partial rope are
layers.Attention's.
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import LayerNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = LayerNorm
