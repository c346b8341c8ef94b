"""EmbeddingGemma in MLX: Gemma 3's layers attending both ways, as an encoder (see the torch file).

Each sequence arrives whole and is padded into one [S, L] batch; every sequence starts at position 0, so
fast.rope at offset 0 serves the batch. Sliding layers add |query - key| <= half_window to the padding mask.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import feed_forward
from lantern.backends.mlx.models.bert import EncoderInputs
from lantern.backends.mlx.models.gemma import GemmaRMSNorm


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, local: bool):
        super().__init__()
        d, self.heads, self.kv_heads, self.head_dim = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attn_scale
        self.theta = cfg.local_rope_theta if local else cfg.rope_theta

    def __call__(self, x: mx.array, inputs: EncoderInputs, mask: mx.array) -> mx.array:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q = self.q_norm(self.q_proj(x).reshape(t, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(t, self.kv_heads, self.head_dim))
        v = self.v_proj(x).reshape(t, self.kv_heads, self.head_dim)
        q, k, v = (a[inputs.gather].transpose(0, 2, 1, 3) for a in (q, k, v))  # [S, H, L, D]
        rope = dict(dims=self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=0)
        q, k = mx.fast.rope(q, **rope), mx.fast.rope(k, **rope)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(s * length, -1)[inputs.scatter])


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.local = cfg.encoder.local[index]
        self.self_attn = Attention(cfg, self.local)
        self.mlp = feed_forward(cfg, index)
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.post_attention_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(d, eps)

    def __call__(self, x: mx.array, inputs: EncoderInputs, masks: dict) -> mx.array:
        h = self.self_attn(self.input_layernorm(x), inputs, masks[self.local])
        x = x + self.post_attention_layernorm(h)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [EncoderLayer(cfg, i) for i in range(cfg.num_layers)]
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GemmaEncoder(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/mlx/embed.py runs it

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache (see models/bert.py)."""
        return (1, 1, 1, True)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        """The final norm's output [T, hidden_size] for every token of the batch."""
        length = inputs.gather.shape[1]
        pos = mx.arange(length)
        near = mx.abs(pos[:, None] - pos[None, :]) <= self.cfg.encoder.half_window
        masks = {False: inputs.key_mask, True: mx.logical_and(inputs.key_mask, near)}
        h = self.model.embed_tokens(input_ids)
        h = h * mx.array(self.cfg.hidden_size**0.5, dtype=h.dtype)  # Gemma's normalizer, in the model dtype
        for layer in self.model.layers:
            h = layer(h, inputs, masks)
        return self.model.norm(h)


CausalLM = GemmaEncoder  # the name models.build_model looks up in a family's file
