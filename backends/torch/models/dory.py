"""Dory in torch over a flattened token batch (maths in app/models/family_dory.py; the MLX file has the same layout):
nGPT's unit-sphere layers without norm weights, the recurrent section run n_recurrent_loops times, each pass of a
layer reading and writing its own layer of the KV pool; the sliding layers' rope of their own base (gemma.LocalRope).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.layers import apply_rotary
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.gemma import LocalRope
from lantern.backends.torch.parallel import TPGroup

Rope = tuple[torch.Tensor, torch.Tensor]


def l2(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, in float32 (DoryL2Norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)


class UnitNorm(nn.Module):
    """The final norm's slot in the Backbone: an L2 norm, no weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2(x)


class DoryAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        h, kv, hd, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        self.h, self.kv, self.hd, self.loops = h, kv, hd, cfg.dory
        self.splits = [h * hd, kv * hd, kv * hd]
        self.qkv_proj = nn.Linear(d, sum(self.splits), bias=False)  # q, k, v stacked by weights.py
        self.gate_proj = nn.Linear(d, h * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.sqk = nn.Parameter(torch.empty(h * hd), requires_grad=False)
        self.s_gate = nn.Parameter(torch.empty(h * hd), requires_grad=False)
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, kv_layer: int, rope: Rope | None) -> torch.Tensor:
        t, hd = x.shape[0], self.hd
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        cos, sin = rope if rope is not None else (meta.cos, meta.sin)
        q = apply_rotary(l2(q.reshape(t, self.h, hd)), cos, sin, False, meta.rope_cache)
        k = apply_rotary(l2(k.reshape(t, self.kv, hd)), cos, sin, False, meta.rope_cache)
        q = q * (self.sqk * self.loops.sqk_scale).square().view(self.h, hd)
        out = paged_attention(q, k, v.reshape(t, self.kv, hd), meta, kv_layer, hd**-0.5, window=self.window)
        gate = torch.sigmoid(self.gate_proj(x) * (self.s_gate * self.loops.s_gate_scale).square())
        return self.o_proj(l2(out.reshape(t, -1) * gate))


class DoryMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inner = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * inner, bias=False)  # gate, up stacked
        self.down_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.suv_gate = nn.Parameter(torch.empty(inner), requires_grad=False)
        self.suv_up = nn.Parameter(torch.empty(inner), requires_grad=False)
        self.scale = cfg.dory.suv_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        gate, up = gate * (self.suv_gate * self.scale), up * (self.suv_up * self.scale)
        return self.down_proj(l2(F.silu(gate) * up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.self_attn = DoryAttention(cfg, layer_idx)
        self.mlp = DoryMLP(cfg)
        self.lambda_1 = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.lambda_2 = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.scale = cfg.dory.lambda_scale
        self.local = self.self_attn.window is not None and cfg.local_rope_theta is not None

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, kv_layer: int, local: Rope | None) -> torch.Tensor:
        h = l2(x)
        a = l2(self.self_attn(h, meta, kv_layer, local if self.local else None))
        h = l2(h + (self.lambda_1 * self.scale).abs() * (a - h))
        m = l2(self.mlp(h))
        return h + (self.lambda_2 * self.scale).abs() * (m - h)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = UnitNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.logit_scale = nn.Parameter(torch.empty(cfg.vocab_size), requires_grad=False)
        self._local_rope = LocalRope(cfg)

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        loops, layers, local = self.cfg.dory, self.model.layers, self._local_rope(meta)
        h = self._embed(input_ids)
        for i in range(loops.n_input):
            h = layers[i](h, meta, i, local)
        start = l2(h)  # each pass restarts from the input section's output
        for loop in range(loops.loops):
            h = l2(h) + start
            for j in range(loops.n_recurrent):
                h = layers[loops.n_input + j](h, meta, loops.recurrent_kv(loop, j), local)
        for k in range(loops.n_output):
            h = layers[loops.n_input + loops.n_recurrent + k](h, meta, loops.output_kv(k), local)
        return l2(h[rows])

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, logits_idx: torch.Tensor) -> torch.Tensor:
        logits = super().forward(input_ids, meta, logits_idx).float()
        return logits * (self.model.logit_scale.float() * self.cfg.dory.logit_factor)
