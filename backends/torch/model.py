"""Llama-family decoder in torch over a flattened token batch (same layout as the MLX model).

Rotary frequencies (default, llama3, YaRN) come from transformers' own rope initialisers, so the
scaling maths is the reference's, not a copy of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.parallel import TPGroup, local_config, parallel_embed, parallel_logits, vocab_shard


def rope_tables(cfg: ModelConfig, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, head_dim] (HF's rotate_half layout), attention scaling folded in."""
    params = {"rope_theta": cfg.rope_theta, "rope_type": "default", **(cfg.rope_scaling or {})}
    rope_type = params["rope_type"]
    if rope_type == "default":
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        scaling = 1.0
    else:  # transformers' config import costs ~3 s at start: only scaled ropes need it
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        hf_cfg = LlamaConfig(
            hidden_size=cfg.num_heads * cfg.head_dim,
            num_attention_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=params,
        )
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, torch.device("cpu"))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq.float())
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling).to(device), (emb.sin() * scaling).to(device)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Norm of x (+ residual): (normed, new residual). One fused kernel on CUDA."""
        return ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.splits = [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim]
        self.qkv_proj = nn.Linear(d, sum(self.splits), bias=bias)  # q, k, v stacked by weights.py
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = q.view(t, self.n_heads, self.head_dim)
        k = k.view(t, self.n_kv, self.head_dim)
        v = v.view(t, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q)[0], self.k_norm(k)[0]
        q, k = ops.rotary(q, meta.cos, meta.sin), ops.rotary(k, meta.cos, meta.sin)
        out = paged_attention(q, k, v, meta, self.layer_idx, self.scale)
        return self.tp.all_reduce(self.o_proj(out.reshape(t, -1)))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate, up stacked
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.tp.all_reduce(self.down_proj(F.silu(gate) * up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.mlp = MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x is the previous sublayer's output, not yet added to the residual stream (the add is
        fused into the next norm)."""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, meta), residual)
        return self.mlp(h), residual


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
