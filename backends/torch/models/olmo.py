"""OLMo 2 / OLMo 3 (and EXAONE 4: per-head q/k norms, NoPE global layers) decoder in torch over a
flattened token batch (the same layout as the MLX file; maths in app/models/family_olmo.py): no norm
before the sublayers, each sublayer's output normed before the residual add, q/k RMSNorms over whole
projections before the rope, and OLMo 3's sliding layers on their own plain rope table (Gemma 3's
arrangement: gemma.CausalLM builds that table).

Tensor parallelism is refused for OLMo (its q/k norms read every head of a token at once), not for
EXAONE 4: attention and MLP all-reduce their outputs before the (replicated) post-sublayer norms.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.layers import Attention, RMSNorm, apply_rotary, feed_forward
from lantern.backends.torch.models import gemma
from lantern.backends.torch.parallel import TPGroup


class OlmoAttention(Attention):
    """layers.Attention's projections and paged attention; q/k normed over all heads together."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp)
        self.q_norm = RMSNorm(self.splits[0], cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.splits[1], cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, meta: TorchAttentionMetadata, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        cos, sin = rope if rope is not None else (meta.cos, meta.sin)
        q = self.q_norm(q.contiguous())[0].view(t, self.n_heads, self.head_dim)
        k = self.k_norm(k.contiguous())[0].view(t, self.n_kv, self.head_dim)
        if self.rotates:  # (OLMo Hybrid without a rope_theta: no rope at all)
            q = apply_rotary(q, cos, sin, False, meta.rope_cache)
            k = apply_rotary(k, cos, sin, False, meta.rope_cache)
        v = v.view(t, self.n_kv, self.head_dim)
        out = paged_attention(q, k, v, meta, self.layer_idx, self.scale, window=self.window)
        return self.o_proj(out.reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        # EXAONE 4's per-head q/k norms are layers.Attention's own (cfg.qk_norm); OLMo's span all heads
        self.self_attn = Attention(cfg, layer_idx, tp) if cfg.qk_norm else OlmoAttention(cfg, layer_idx, tp)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.local_rope = self.self_attn.window is not None and cfg.local_rope_theta is not None

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        local_rope: gemma.Rope | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's normed MLP output, not yet added to the residual stream."""
        h = x if residual is None else x + residual
        h = h + self.post_attention_layernorm(self.self_attn(h, meta, local_rope if self.local_rope else None))[0]
        return self.post_feedforward_layernorm(self.mlp(h))[0], h


class CausalLM(gemma.CausalLM):
    """Gemma's shell for its sliding layers' rope table (layer_extras); Llama's norms and embedding."""

    decoder_layer = DecoderLayer
    final_norm = RMSNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active and not cfg.qk_norm:  # (EXAONE 4's per-head norms split with their heads)
            raise ValueError(
                "tensor parallelism is not implemented for OLMo's q/k norms over all heads; "
                "serve this model with --tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)
