"""Meituan LongCat-Flash decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_longcat.py): per layer two sublayers of DeepSeek's latent attention (deepseek.MLAttention, its LoRA
scales from the config; KV pool layers 2i and 2i + 1) each followed by a dense MLP, and the shortcut mixture: read
from the first MLP's input, added with the second MLP's output. Its router chooses among the experts and "zero"
experts (ids past them), whose output is their input times their weight.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import MLP, RMSNorm
from lantern.backends.torch.models import deepseek
from lantern.backends.torch.models.deepseek import DeepSeekMoE, MLAttention, Router
from lantern.backends.torch.parallel import TPGroup


class ShortcutMoE(DeepSeekMoE):
    """DeepSeek's routed experts whose router also picks zero experts: a float32 softmax over every choice, the pick
    by score + bias, the picked scores times routed_scaling_factor (not renormalised)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__(cfg, tp)
        moe = cfg.moe
        self.gate = Router(moe.num_experts + moe.zero_experts, cfg.hidden_size, bias=True)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moe = self.moe
        scores = torch.softmax(x.float() @ self.gate.weight.float().T, dim=-1)
        choice = scores + self.gate.e_score_correction_bias.float()
        ids = choice.topk(moe.top_k, dim=-1).indices
        return ids, scores.gather(1, ids) * moe.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)  # (float32 weights: each expert's share in float32, as transformers)
        zero = ids >= self.moe.num_experts
        routed = self.routed(x, ids.masked_fill(zero, 0), weights.masked_fill(zero, 0.0))
        return routed + (x.float() * (weights * zero).sum(dim=-1, keepdim=True)).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = nn.ModuleList([MLAttention(cfg, 2 * layer_idx + i) for i in range(2)])
        self.mlps = nn.ModuleList([MLP(cfg, tp) for _ in range(2)])
        self.mlp = ShortcutMoE(cfg, tp)
        self.input_layernorm = nn.ModuleList([RMSNorm(d, eps) for _ in range(2)])
        self.post_attention_layernorm = nn.ModuleList([RMSNorm(d, eps) for _ in range(2)])

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, not yet added to the residual stream."""
        shortcut = None
        for i in range(2):
            h, residual = self.input_layernorm[i](x, residual)
            h, residual = self.post_attention_layernorm[i](self.self_attn[i](h, meta), residual)
            if i == 0:
                shortcut = self.mlp(h)
            x = self.mlps[i](h)
        return x + shortcut, residual


class CausalLM(deepseek.CausalLM):
    decoder_layer = DecoderLayer

    def finish_load(self, dtype: torch.dtype) -> None:
        """Each latent attention's quantized kv_b_proj made dense once (MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            for attn in layer.self_attn:
                attn.dense_kv_b(dtype)
