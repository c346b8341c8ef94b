"""Meituan LongCat-Flash decoder in MLX (maths in app/models/family_longcat.py; the torch file has the same layout):
per layer two sublayers of DeepSeek's latent attention (deepseek.MLAttention, its LoRA scales from the config; KV
pool layers 2i and 2i + 1) each followed by a dense MLP, and the shortcut mixture read from the first MLP's input,
added with the second MLP's output; its router also picks "zero" experts, whose output is their input."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import MLP
from lantern.backends.mlx.models import deepseek
from lantern.backends.mlx.models.deepseek import DeepSeekMoE, MLAttention, Router, _top_k
from lantern.backends.mlx.paged_attention import AttentionMetadata


class ShortcutMoE(DeepSeekMoE):
    """DeepSeek's routed experts whose router also picks zero experts: a float32 softmax over every choice, the pick
    by score + bias, the picked scores times routed_scaling_factor (not renormalised)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        moe = cfg.moe
        self.gate = Router(moe.num_experts + moe.zero_experts, cfg.hidden_size, bias=True)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        moe = self.moe
        scores = mx.softmax(x.astype(mx.float32) @ self.gate.weight.astype(mx.float32).T, axis=-1, precise=True)
        ids = _top_k(scores + self.gate.e_score_correction_bias.astype(mx.float32), moe.top_k)
        return ids, mx.take_along_axis(scores, ids, axis=-1) * moe.routed_scaling_factor

    def __call__(self, x: mx.array) -> mx.array:
        ids, weights = self.route(x)
        zero = ids >= self.moe.num_experts
        y = self.experts(x, mx.where(zero, 0, ids))  # [T, k, hidden]
        routed = (y * mx.where(zero, 0.0, weights)[..., None]).astype(x.dtype).sum(axis=1)
        identity = x.astype(mx.float32) * mx.where(zero, weights, 0.0).sum(axis=-1, keepdims=True)
        return routed + identity.astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = [MLAttention(cfg, 2 * layer_idx + i) for i in range(2)]
        self.mlps = [MLP(cfg) for _ in range(2)]
        self.mlp = ShortcutMoE(cfg)
        self.input_layernorm = [nn.RMSNorm(d, eps=eps) for _ in range(2)]
        self.post_attention_layernorm = [nn.RMSNorm(d, eps=eps) for _ in range(2)]

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        shortcut = None
        for i in range(2):
            x = x + self.self_attn[i](self.input_layernorm[i](x), meta)
            h = self.post_attention_layernorm[i](x)
            if i == 0:
                shortcut = self.mlp(h)
            x = x + self.mlps[i](h)
        return x + shortcut


class CausalLM(deepseek.CausalLM):
    decoder_layer = DecoderLayer

    def finish_load(self, dtype: mx.Dtype) -> None:
        """Each latent attention's quantized kv_b_proj made dense once (MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            for attn in layer.self_attn:
                attn.dense_kv_b(dtype)
