"""GLM-4 decoder (GLM-4-9B/32B-0414, GLM-Z1) over a flattened token batch.

What differs from the Llama file: the rope rotates consecutive pairs of the first
int(head_dim * partial_rotary_factor) dims of each head (layers.Attention with rope_interleaved),
and each sublayer's output is normed (post_self_attn_layernorm, post_mlp_layernorm) before it
joins the residual stream. q/k/v biases come from ModelConfig.attention_bias; the checkpoint's
fused gate_up_proj arrives split into gate_proj / up_proj (weight_stream.split_fused).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, rope_interleaved=True)
        self.mlp = feed_forward(cfg, layer_idx)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_self_attn_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)  # the MLP's input norm, despite its name
        self.post_mlp_layernorm = nn.RMSNorm(d, eps=eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.post_self_attn_layernorm(self.self_attn(self.input_layernorm(x), meta))
        return h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h)))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
