"""GLM-4 decoder in torch (GLM-4-9B/32B-0414, GLM-Z1) over a flattened token batch: the same
layout as the MLX file. The rope rotates consecutive pairs of the first rotary_dim dims of each
head (layers.Attention with rope_interleaved; the runner's rope table is rotary_dim wide), and each
sublayer's output is normed before the residual add, which the next norm fuses in.

Tensor parallelism works as for Llama: attention and MLP all-reduce their outputs before the
(replicated) post-sublayer norms see them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, RMSNorm, feed_forward
from lantern.backends.torch.parallel import TPGroup, local_config, parallel_embed, parallel_logits, vocab_shard


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp, rope_interleaved=True)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_self_attn_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)  # the MLP's input norm, despite its name
        self.post_mlp_layernorm = RMSNorm(d, eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's normed MLP output, not yet added to the residual stream."""
        h, residual = self.input_layernorm(x, residual)
        attn = self.post_self_attn_layernorm(self.self_attn(h, meta))[0]
        h, residual = self.post_attention_layernorm(attn, residual)
        return self.post_mlp_layernorm(self.mlp(h))[0], residual


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, vocab_rows: int):
        super().__init__()
        # An explicit (meta) weight skips the random init, which imports torch._dynamo (~3 s).
        self.embed_tokens = nn.Embedding(vocab_rows, cfg.hidden_size, _weight=torch.empty(vocab_rows, cfg.hidden_size))
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """With tp.world > 1 this is one rank's shard (see parallel.py); cfg is the full model's."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        rows = vocab_shard(cfg.vocab_size, tp)[2] if tp.active else cfg.vocab_size
        self.model = Backbone(local_config(cfg, tp.world), tp, rows)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, rows, bias=False)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, logits_idx: torch.Tensor) -> torch.Tensor:
        h = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, meta)
        h = self.model.norm(h[logits_idx], residual[logits_idx])[0]
        return parallel_logits(h, self._head, self.tp, self.cfg.vocab_size)

    # The embedding and the head may be float (nn.Embedding / nn.Linear) or quantized layers
    # (quant_linear.py: the embedding's logits() reads its table for a tied head).
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.model.embed_tokens
        return F.embedding(ids, table.weight) if isinstance(table, nn.Embedding) else table(ids)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        if not self.cfg.tie_word_embeddings:
            return self.lm_head(h)
        table = self.model.embed_tokens
        return F.linear(h, table.weight) if isinstance(table, nn.Embedding) else table.logits(h)
