"""Jais 2 and StarCoder2 decoder in torch over a flattened token batch (maths in app/models/family_jais2.py and
family_starcoder2.py; the MLX file has the same layout): Llama's decoder layer under LayerNorms with biases,
attention biased on q, k, v and o_proj, and an ungated MLP with biases: Nemotron's relu^2 (Jais 2), GELU (StarCoder2).
"""

from __future__ import annotations

import torch

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import ACTIVATIONS, Attention, LayerNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.nemotron_h import Relu2MLP
from lantern.backends.torch.parallel import TPGroup


class UngatedMLP(Relu2MLP):
    """down(act(up(x))): Jais 2's relu^2, StarCoder2's GELU (tanh) (cfg.hidden_act)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, bias: bool):
        super().__init__(cfg, tp, bias=bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.act(self.up_proj(x))))


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        o_bias = cfg.attention_bias if cfg.attn_out_bias is None else cfg.attn_out_bias  # (GPT-Neo: o_proj's only)
        attn = Attention(cfg, layer_idx, tp, o_bias=o_bias)
        super().__init__(cfg, layer_idx, tp, attn=attn, mlp=UngatedMLP(cfg, tp, bias=cfg.mlp_bias))
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = LayerNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:  # (each rank would add o_proj's and down_proj's biases before the all-reduce sums them)
            raise ValueError(
                f"tensor parallelism is not implemented for {cfg.architecture}'s output biases; "
                "serve this model with --tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)
