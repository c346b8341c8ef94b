"""Jais 2 decoder in torch over a flattened token batch (maths in app/models/family_jais2.py; the MLX file has the
same layout): Llama's decoder layer under LayerNorms with biases, attention biased on q, k, v and o_proj, and
Nemotron's ungated relu^2 MLP with biases (models/nemotron_h.Relu2MLP).
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention, LayerNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.nemotron_h import Relu2MLP
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        attn = Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias)
        super().__init__(cfg, layer_idx, tp, attn=attn, mlp=Relu2MLP(cfg, tp, bias=cfg.mlp_bias))
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = LayerNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:  # (each rank would add o_proj's and down_proj's biases before the all-reduce sums them)
            raise ValueError(
                "tensor parallelism is not implemented for Jais 2's output biases; "
                "serve this model with --tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)
