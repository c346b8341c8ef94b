"""OLMo 2 / OLMo 3 (and EXAONE 4: per-head q/k norms, NoPE global layers) decoder for MLX over a
flattened token batch (maths in app/models/family_olmo.py; the torch file has the same layout): no
norm before the sublayers, each sublayer's output normed before the residual add, q/k RMSNorms over
whole projections before the rope. OLMo 3's sliding layers take their plain rope base from
ModelConfig.local_rope_theta (layers.Attention).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention, feed_forward
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention


class OlmoAttention(Attention):
    """layers.Attention's projections, rope and paged attention; q/k normed over all heads together."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.q_norm = nn.RMSNorm(self.n_heads * self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.n_kv * self.head_dim, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x)).reshape(t, self.n_heads, 1, self.head_dim)
        k = self.k_norm(self.k_proj(x)).reshape(t, self.n_kv, 1, self.head_dim)
        v = self.v_proj(x).reshape(t, self.n_kv, self.head_dim)
        if self.rotates:  # (OLMo Hybrid without a rope_theta: no rope at all)
            q, k = self.rope(q, offset=meta.positions), self.rope(k, offset=meta.positions)  # one offset per token
        q, k = q[:, :, 0, :], k[:, :, 0, :]
        out = paged_attention(q, k, v, meta, self.layer_idx, self.scale, window=self.window)
        return self.o_proj(out.reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        # EXAONE 4's per-head q/k norms are layers.Attention's own (cfg.qk_norm); OLMo's span all heads
        self.self_attn = Attention(cfg, layer_idx) if cfg.qk_norm else OlmoAttention(cfg, layer_idx)
        self.mlp = feed_forward(cfg, layer_idx)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_feedforward_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(x, meta))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
