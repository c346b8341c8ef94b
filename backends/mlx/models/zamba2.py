"""Zamba2 in MLX over a flattened token batch (maths in app/models/family_zamba2.py; the torch file has the same
layout): every layer a Mamba-2 mixer block (granite_hybrid's Mamba2Mixer and state slots, one per layer); a hybrid
layer first runs its shared transformer block on [x, embedding] with its own adapters and K/V pool layer, and adds
linear(block output) to its mixer's input.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, Attention
from lantern.backends.mlx.models import granite_hybrid
from lantern.backends.mlx.paged_attention import AttentionMetadata


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
        self._attention = z.attention_adapters  # (a leading _: not a parameter)

    def qkv(self, x: mx.array) -> tuple[mx.array, ...] | None:
        if not self._attention:
            return None
        return tuple(self[f"{t}_b"](self[f"{t}_a"](x)) for t in "qkv")


class SharedMLP(nn.Module):
    """act(gate) * up from the fused gate_up_proj (plus the calling layer's adapter term), then down_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        bias = cfg.zamba2.mlp_bias
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self._act = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x: mx.array, adapters: Adapters) -> mx.array:
        gate, up = mx.split(self.gate_up_proj(x) + adapters.mlp_b(adapters.mlp_a(x)), 2, axis=-1)
        return self.down_proj(self._act(gate) * up)


class SharedBlock(nn.Module):
    """One of num_mem_blocks: attention over RMSNorm([x, e]) then the MLP over RMSNorm(attention), no residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(2 * cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 0, input_size=2 * cfg.hidden_size)
        self.pre_ff_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.feed_forward = SharedMLP(cfg)

    def __call__(
        self, x: mx.array, embedded: mx.array, meta: AttentionMetadata, kv_layer: int, adapters: Adapters
    ) -> mx.array:
        h = self.input_layernorm(mx.concatenate([x, embedded], axis=-1))
        h = self.self_attn(h, meta, kv_layer=kv_layer, qkv_delta=adapters.qkv(h))
        return self.feed_forward(self.pre_ff_layernorm(h), adapters)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.mamba = granite_hybrid.Mamba2Mixer(cfg, layer_idx)  # (every layer keeps a state)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        z = cfg.zamba2
        self._hybrid = layer_idx in z.hybrid_layers
        if self._hybrid:
            self._kv_layer = z.hybrid_layers.index(layer_idx)
            self._block = self._kv_layer % z.num_blocks
            self.linear = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
            self.adapter = Adapters(cfg)

    def __call__(
        self,
        x: mx.array,
        embedded: mx.array,
        meta: AttentionMetadata,
        state: granite_hybrid.MambaState,
        shared: list[SharedBlock],
    ) -> mx.array:
        h = x
        if self._hybrid:
            h = x + self.linear(shared[self._block](x, embedded, meta, self._kv_layer, self.adapter))
        return x + self.mamba(self.input_layernorm(h), meta, state)


class CausalLM(granite_hybrid.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.model.shared_transformers = [SharedBlock(cfg) for _ in range(cfg.zamba2.num_blocks)]

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        embedded = self.model.embed_tokens(input_ids)
        h, shared = embedded, self.model.shared_transformers
        for layer in self.model.layers:
            h = layer(h, embedded, meta, self.recurrent, shared)
        if rows.size == 0:
            return mx.zeros((0, self.cfg.hidden_size), dtype=h.dtype)
        return self.model.norm(h[rows])
