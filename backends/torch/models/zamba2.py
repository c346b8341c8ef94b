"""Zamba2 in torch over a flattened token batch (maths in app/models/family_zamba2.py; the MLX file has the same
layout): every layer a Mamba-2 mixer block (granite_hybrid's Mamba2Mixer and state slots, one per layer); a hybrid
layer first runs its shared transformer block on [x, embedding] with its own adapters and K/V pool layer, and adds
linear(block output) to its mixer's input.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import ACTIVATIONS, Attention, RMSNorm
from lantern.backends.torch.models import granite_hybrid
from lantern.backends.torch.parallel import TPGroup, parallel_embed


class Adapters(nn.Module):
    """A hybrid layer's LoRA-style terms on its shared block: down (a) then up (b) projections of the block's
    normed input for q / k / v (use_shared_attention_adapter) and of the MLP's input for gate_up."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        z, rank, width = cfg.zamba2, cfg.zamba2.adapter_rank, 2 * cfg.hidden_size
        if z.attention_adapters:
            for target in "qkv":
                setattr(self, f"{target}_a", nn.Linear(width, rank, bias=False))
                setattr(self, f"{target}_b", nn.Linear(rank, width, bias=False))
        self.mlp_a = nn.Linear(cfg.hidden_size, rank, bias=False)
        self.mlp_b = nn.Linear(rank, 2 * cfg.intermediate_size, bias=False)
        self.attention = z.attention_adapters

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        if not self.attention:
            return None
        return tuple(getattr(self, f"{t}_b")(getattr(self, f"{t}_a")(x)) for t in "qkv")


class SharedMLP(nn.Module):
    """act(gate) * up from the fused gate_up_proj (plus the calling layer's adapter term), then down_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        bias = cfg.zamba2.mlp_bias
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor, adapters: Adapters) -> torch.Tensor:
        gate, up = (self.gate_up_proj(x) + adapters.mlp_b(adapters.mlp_a(x))).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class SharedBlock(nn.Module):
    """One of num_mem_blocks: attention over RMSNorm([x, e]) then the MLP over RMSNorm(attention), no residual."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(2 * cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 0, tp, input_size=2 * cfg.hidden_size)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = SharedMLP(cfg)

    def forward(
        self, x: torch.Tensor, embedded: torch.Tensor, meta: TorchAttentionMetadata, kv_layer: int, adapters: Adapters
    ) -> torch.Tensor:
        h = self.input_layernorm(torch.cat([x, embedded], dim=-1))[0]
        h = self.self_attn(h, meta, kv_layer=kv_layer, qkv_delta=adapters.qkv(h))
        return self.feed_forward(self.pre_ff_layernorm(h)[0], adapters)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.mamba = granite_hybrid.Mamba2Mixer(cfg, layer_idx)  # (every layer keeps a state)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        z = cfg.zamba2
        self.hybrid = layer_idx in z.hybrid_layers
        if self.hybrid:
            self.kv_layer = z.hybrid_layers.index(layer_idx)
            self.block = self.kv_layer % z.num_blocks
            self.linear = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
            self.adapter = Adapters(cfg)

    def forward(
        self,
        x: torch.Tensor,
        embedded: torch.Tensor,
        meta: TorchAttentionMetadata,
        state: granite_hybrid.MambaState,
        shared: nn.ModuleList,
    ) -> torch.Tensor:
        h = x
        if self.hybrid:
            h = x + self.linear(shared[self.block](x, embedded, meta, self.kv_layer, self.adapter))
        return x + self.mamba(self.input_layernorm(h)[0], meta, state)


class CausalLM(granite_hybrid.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.shared_transformers = nn.ModuleList([SharedBlock(cfg, tp) for _ in range(cfg.zamba2.num_blocks)])

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        embedded = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        h, shared = embedded, self.model.shared_transformers
        for layer in self.model.layers:
            h = layer(h, embedded, meta, self.state, shared)
        return self.model.norm(h[rows])[0]
