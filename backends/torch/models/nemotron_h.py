"""Nemotron-H decoder in torch over a flattened token batch (maths in app/models/family_nemotron_h.py; the same
layout as the MLX file): each block is `x + mixer(RMSNorm(x))` with one mixer, by its pattern letter a Mamba-2
mixer keeping a state per sequence (granite_hybrid's Mamba2Mixer and slots), NoPE attention over the paged pool
(which holds the attention layers only), a relu^2 MLP without a gate, or (E, Nemotron 3) relu^2 experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, RMSNorm
from lantern.backends.torch.models import deepseek, granite_hybrid
from lantern.backends.torch.parallel import TPGroup


class Relu2MLP(nn.Module):
    """down(relu(up(x)) ** 2): Nemotron's MLP, no gate (width: intermediate_size unless given; bias: Jais 2's)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, width: int | None = None, bias: bool = False):
        super().__init__()
        self.tp = tp
        width = width or cfg.intermediate_size
        self.up_proj = nn.Linear(cfg.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(F.relu(self.up_proj(x)).square_()))


class NemotronMoE(deepseek.DeepSeekMoE):
    """Nemotron 3's E mixer: DeepSeek-V3's sigmoid router (e_score_correction_bias, groups, scaled weights) over
    ungated relu^2 experts (MoEConfig.gated false), which LatentMoE models run in a narrower space between
    fc1_latent_proj and fc2_latent_proj; a relu^2 shared expert on the block's input. The k weighted expert
    outputs are summed in float32 (transformers' NemotronHExperts)."""

    sum_float32 = True

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__(cfg, tp, shared_experts=Relu2MLP(cfg, tp, cfg.moe.shared_size))
        latent = cfg.moe.latent_size
        if latent:
            self.fc1_latent_proj = nn.Linear(cfg.hidden_size, latent, bias=False)
            self.fc2_latent_proj = nn.Linear(latent, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        latent = self.moe.latent_size
        y = self.routed(self.fc1_latent_proj(x) if latent else x, ids, weights)
        return (self.fc2_latent_proj(y) if latent else y) + self.shared_experts(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.mamba.layer_kinds
        self.kind = kinds[layer_idx]
        if self.kind == "M":  # its place among the Mamba layers' states
            self.mamba = granite_hybrid.Mamba2Mixer(cfg, kinds[:layer_idx].count("M"))
        elif self.kind == "*":  # its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, kinds[:layer_idx].count("*"), tp)
        elif self.kind == "E":
            self.mlp = NemotronMoE(cfg, tp)
        else:
            self.mlp = Relu2MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: TorchAttentionMetadata,
        state: granite_hybrid.MambaState,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        if self.kind == "M":
            return self.mamba(h, meta, state), residual
        if self.kind == "*":
            return self.self_attn(h, meta), residual
        return self.mlp(h), residual


class CausalLM(granite_hybrid.CausalLM):
    """Granite 4.0-H's shell: the same Mamba state, sized by the same Mamba2Config."""

    decoder_layer = Block
