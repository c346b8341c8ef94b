"""PhiMoE (Phi-3.5-MoE) decoder in torch over a flattened token batch (maths in app/models/family_phimoe.py; the
MLX file has the same layout): Llama's decoder layer under LayerNorms with biases, attention biased on q, k, v
and o_proj, Mixtral's experts routed by SparseMixer (moe.sparsemixer); the head's bias is llama.CausalLM's.
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention, LayerNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, attn=Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias))
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = LayerNorm
