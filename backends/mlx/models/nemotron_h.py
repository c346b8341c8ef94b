"""Nemotron-H decoder in MLX over a flattened token batch (maths in app/models/family_nemotron_h.py; the torch
file has the same layout): each block is `x + mixer(RMSNorm(x))` with one mixer, by its pattern letter a
Mamba-2 mixer with a per-sequence state (granite_hybrid's Mamba2Mixer and slots), NoPE attention over the paged
pool (attention layers only), a relu^2 MLP without a gate, or (E, Nemotron 3) relu^2 experts.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import deepseek, granite_hybrid
from lantern.backends.mlx.paged_attention import AttentionMetadata


class Relu2MLP(nn.Module):
    """down(relu(up(x)) ** 2): Nemotron's MLP, no gate (width: intermediate_size unless given; bias: Jais 2's)."""

    def __init__(self, cfg: ModelConfig, width: int | None = None, bias: bool = False):
        super().__init__()
        width = width or cfg.intermediate_size
        self.up_proj = nn.Linear(cfg.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, cfg.hidden_size, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(mx.square(nn.relu(self.up_proj(x))))


class NemotronMoE(deepseek.DeepSeekMoE):
    """Nemotron 3's E mixer: DeepSeek-V3's sigmoid router over ungated relu^2 experts, run between
    fc1_latent_proj and fc2_latent_proj in LatentMoE models; a relu^2 shared expert on the block's input."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, shared_experts=Relu2MLP(cfg, cfg.moe.shared_size))
        latent = cfg.moe.latent_size
        if latent:
            self.fc1_latent_proj = nn.Linear(cfg.hidden_size, latent, bias=False)
            self.fc2_latent_proj = nn.Linear(latent, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        ids, weights = self.route(x)
        latent = self.moe.latent_size
        y = self.experts(self.fc1_latent_proj(x) if latent else x, ids)  # [T, k, H or latent]
        y = (y * weights[..., None]).sum(axis=1).astype(x.dtype)  # summed in float32 (transformers' NemotronHExperts)
        return (self.fc2_latent_proj(y) if latent else y) + self.shared_experts(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.mamba.layer_kinds
        self.kind = kinds[layer_idx]
        if self.kind == "M":  # its place among the Mamba layers' states
            self.mamba = granite_hybrid.Mamba2Mixer(cfg, kinds[:layer_idx].count("M"))
        elif self.kind == "*":  # its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, kinds[:layer_idx].count("*"))
        elif self.kind == "E":
            self.mlp = NemotronMoE(cfg)
        else:
            self.mlp = Relu2MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: granite_hybrid.MambaState) -> mx.array:
        h = self.input_layernorm(x)
        if self.kind == "M":
            return x + self.mamba(h, meta, state)
        if self.kind == "*":
            return x + self.self_attn(h, meta)
        return x + self.mlp(h)


class CausalLM(granite_hybrid.CausalLM):
    """Granite 4.0-H's shell: the same Mamba state, sized by the same Mamba2Config."""

    decoder_layer = Block
