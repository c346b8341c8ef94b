"""StepFun Step 3.5 Flash decoder in MLX (maths in app/models/family_step3p5.py): Laguna's DeepSeek-mixture Llama
layer (layers.Attention reads per-layer heads, the per-head sigmoid gate and the sliding layers' rope from the
config) under Gemma's zero-centred norms (the q/k norms too), its SwiGLUs clamped per layer:
min(silu(gate), limit) * clip(up, -limit, limit)."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP, Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.models.deepseek import DeepSeekMoE
from lantern.backends.mlx.models.gemma import GemmaRMSNorm


def clamped_glu(limit: float) -> Callable[[mx.array, mx.array], mx.array]:
    def glu(gate: mx.array, up: mx.array) -> mx.array:
        return mx.minimum(nn.silu(gate), limit) * mx.clip(up, -limit, limit)

    return glu


class ClampedMLP(MLP):
    """The gated MLP with Step's clamp where the layer has one (limit None: layers.MLP as it is)."""

    def __init__(self, cfg: ModelConfig, inner: int | None, limit: float | None):
        super().__init__(cfg, inner)
        self.limit = limit

    def __call__(self, x: mx.array) -> mx.array:
        if self.limit is None:
            return super().__call__(x)
        return self.down_proj(clamped_glu(self.limit)(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        limits = cfg.swiglu_limits
        routed, shared = (limits.routed[layer_idx], limits.shared[layer_idx]) if limits else (None, None)
        mlp: nn.Module
        if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
            experts = ClampedMLP(cfg, cfg.moe.shared_size, shared) if cfg.moe.shared_size else None
            mlp = DeepSeekMoE(cfg, shared_experts=experts)
            if routed is not None:
                mlp.experts.glu = clamped_glu(routed)
        else:
            mlp = ClampedMLP(cfg, None, shared)
        super().__init__(cfg, layer_idx, attn=Attention(cfg, layer_idx, norm=GemmaRMSNorm), mlp=mlp)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = GemmaRMSNorm
