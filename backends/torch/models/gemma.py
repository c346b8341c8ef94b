"""Gemma 2 / Gemma 3 (text) decoder in torch over a flattened token batch (the same layout as the
MLX file): (1 + weight) RMSNorm in float32, embeddings times sqrt(hidden_size) in the model dtype,
sandwich norms, GeGLU, soft-capped logits, and Gemma 3's sliding layers on their own rope table.

Tensor parallelism works as for Llama: attention and MLP all-reduce their outputs before the
(replicated) sandwich norms see them.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.layers import Attention, feed_forward, rope_tables
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup

Rope = tuple[torch.Tensor, torch.Tensor]


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight) with the residual add fused in, like layers.RMSNorm. The weight is
    the checkpoint's (centred on 0): the loader fills it by name, the 1 is added here in float32."""

    offset = 1.0  # (FloatRMSNorm: 0, the weight as stored)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed x + residual, x + residual)."""
        scale = self.weight.float() + self.offset
        if ops.use_triton(x):  # the fused kernel reads a float32 weight as is
            return ops.rms_norm(x, scale, self.eps, residual)
        # transformers' order: norm and (1 + w) product in float32, one rounding at the end.
        h = x if residual is None else x + residual
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps) * scale).to(h.dtype), h


class FloatRMSNorm(GemmaRMSNorm):
    """x / rms(x) * weight, the product in float32 and one rounding (Muse Glimmer's final norm; Llama's layers.RMSNorm
    rounds the normed x first)."""

    offset = 0.0


class DecoderLayer(nn.Module):
    qk_norm: type[nn.Module] = GemmaRMSNorm  # the per-head q/k norms' class, when the config has them

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp, norm=self.qk_norm)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.sandwich = cfg.sandwich_norms  # (VaultGemma has no norm after attention nor after the MLP)
        if self.sandwich:  # (their eps: post_norm_eps where it differs, Muse Glimmer's)
            post_eps = cfg.post_norm_eps if cfg.post_norm_eps is not None else eps
            self.post_attention_layernorm = GemmaRMSNorm(d, post_eps)
            self.post_feedforward_layernorm = GemmaRMSNorm(d, post_eps)
        # Gemma 3's sliding layers rotate with a plain rope of their own base (CausalLM's table).
        self.local_rope = self.self_attn.window is not None and cfg.local_rope_theta is not None

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, local_rope: Rope | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's (normed) MLP output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        attn = self.self_attn(h, meta, local_rope if self.local_rope else None)
        if not self.sandwich:
            h, residual = self.pre_feedforward_layernorm(attn, residual)
            return self.mlp(h), residual
        h, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(attn)[0], residual)
        return self.post_feedforward_layernorm(self.mlp(h))[0], residual


class LocalRope:
    """The sliding layers' plain rope of their own base (ModelConfig.local_rope_theta: Gemma 3, OLMo 3, Mellum,
    Laguna, LFM3): (cos, sin) at each token's position from a table built on first use on the step's device, turning
    `dim` dims of each head (None: local_rope_dim, else the rope table's width)."""

    def __init__(self, cfg: ModelConfig, dim: int | None = None):
        self.cfg, self.dim = cfg, dim
        self.table: Rope | None = None

    def __call__(self, meta: TorchAttentionMetadata) -> Rope | None:
        """None when the model has no such rope (its sliding layers share the model's)."""
        cfg = self.cfg
        if cfg.local_rope_theta is None:
            return None
        device = meta.cos.device
        # Built outside CUDA-graph capture: the graph runner's warm-up steps come first.
        if self.table is None or self.table[0].device != device:
            dim = self.dim or cfg.local_rope_dim
            self.table = rope_tables(cfg, cfg.max_context, device, cfg.local_rope_theta, dim)
        cos, sin = self.table
        return cos[meta.positions], sin[meta.positions]


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = GemmaRMSNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self._local_rope = LocalRope(cfg)

    def layer_extras(self, meta: TorchAttentionMetadata) -> tuple:
        return (self._local_rope(meta),)
