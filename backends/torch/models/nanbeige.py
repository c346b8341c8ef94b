"""Nanbeige 4.2 in torch over a flattened token batch (maths in app/models/family_nanbeige.py; the MLX file has the
same layout): Llama's layers run num_loops times, each loop's pass of a layer over its own layer of the KV pool.
"""

from __future__ import annotations

import torch

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup, parallel_embed


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        attn = Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias)  # (attention_bias: o_proj's too)
        super().__init__(cfg, layer_idx, tp, attn=attn)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, kv_layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, meta, kv_layer=kv_layer), residual)
        return self.mlp(h), residual


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        loops, layers = self.cfg.loops, self.model.layers
        h, residual = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size), None
        for loop in range(loops.loops):
            for i, layer in enumerate(layers):
                h, residual = layer(h, residual, meta, loop * len(layers) + i)
            if loops.norm_between and loop < loops.loops - 1:
                h, residual = self.model.norm(h, residual)[0], None
        return self.model.norm(h[rows], residual[rows])[0]
