"""EmbeddingGemma in torch: Gemma 3's layers (models/gemma.py's (1 + w) norms, sandwich norms, q/k norms, GeGLU,
the scaled embedding) attending both ways, as an encoder (app/models/family_gemma.BidirectionalGemma).

No KV cache: each sequence arrives whole and is padded into one [S, L] batch, as models/bert.py does; every
sequence starts at position 0, so one rope table per layer type serves the batch. Sliding layers add
|query - key| <= half_window to the padding mask; the module tree is the decoder's (model.embed_tokens,
model.layers, model.norm), so a checkpoint loads by its own names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import feed_forward
from lantern.backends.torch.models.bert import EncoderInputs, rope_table, rotate
from lantern.backends.torch.models.gemma import GemmaRMSNorm
from lantern.backends.torch.parallel import TPGroup


def _norm(x: torch.Tensor, norm: GemmaRMSNorm) -> torch.Tensor:
    return norm(x)[0]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, self.heads, self.kv_heads, self.head_dim = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.splits = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        self.qkv_proj = nn.Linear(d, sum(self.splits), bias=False)  # q, k, v stacked by weights.py
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attn_scale

    def forward(self, x: torch.Tensor, inputs: EncoderInputs, rope: tuple, mask: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        s, length = inputs.gather.shape
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = _norm(q.view(t, self.heads, self.head_dim), self.q_norm)
        k = _norm(k.view(t, self.kv_heads, self.head_dim), self.k_norm)
        v = v.view(t, self.kv_heads, self.head_dim)
        q, k, v = (a[inputs.gather].transpose(1, 2) for a in (q, k, v))  # [S, H, L, D]
        q, k = rotate(q, *rope), rotate(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(s * length, -1)[inputs.scatter])


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.local = cfg.encoder.local[index]
        self.self_attn = Attention(cfg)
        self.mlp = feed_forward(cfg, index, TPGroup())
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.post_attention_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(d, eps)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs, ropes: dict, masks: dict) -> torch.Tensor:
        h = self.self_attn(_norm(x, self.input_layernorm), inputs, ropes[self.local], masks[self.local])
        x = x + _norm(h, self.post_attention_layernorm)
        h = self.mlp(_norm(x, self.pre_feedforward_layernorm))
        return x + _norm(h, self.post_feedforward_layernorm)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        rows, d = cfg.vocab_size, cfg.hidden_size
        self.embed_tokens = nn.Embedding(rows, d, _weight=torch.empty(rows, d))
        self.layers = nn.ModuleList([EncoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = GemmaRMSNorm(d, cfg.rms_norm_eps)


class GemmaEncoder(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/torch/embed.py runs it

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__()
        if tp.active:
            raise ValueError("tensor parallelism is not implemented for EmbeddingGemma")
        self.cfg = cfg
        self.model = Backbone(cfg)

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache (see models/bert.py)."""
        return (1, 1, 1, True)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        """The final norm's output [T, hidden_size] for every token of the batch."""
        cfg, length, device = self.cfg, inputs.gather.shape[1], input_ids.device
        ropes = {
            False: rope_table(length, cfg.head_dim, cfg.rope_theta, device),
            True: rope_table(length, cfg.head_dim, cfg.local_rope_theta, device),
        }
        pos = torch.arange(length, device=device)
        near = (pos[:, None] - pos[None, :]).abs() <= cfg.encoder.half_window
        masks = {False: inputs.key_mask, True: inputs.key_mask & near}
        table = self.model.embed_tokens
        h = F.embedding(input_ids, table.weight) if isinstance(table, nn.Embedding) else table(input_ids)
        h = h * torch.tensor(cfg.hidden_size**0.5, dtype=h.dtype)  # Gemma's normalizer, in the model dtype
        for layer in self.model.layers:
            h = layer(h, inputs, ropes, masks)
        return _norm(h, self.model.norm)


CausalLM = GemmaEncoder  # the name models.build_model looks up in a family's file
