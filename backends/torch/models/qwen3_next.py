"""Qwen3-Next / Qwen3.5 (dense and MoE) decoder in torch over a flattened token batch (maths in
app/models/family_qwen3_next.py; the same layout as the MLX file): gated DeltaNet layers keeping a
recurrent state per sequence, gated full attention over the paged pool every few layers.

The state lives here, allocated by the runner (allocate_state) with one slot per sequence the engine
may run: per linear layer the convolution's last K-1 inputs (model dtype) and the [heads, d_k, d_v]
delta-rule state (float32). A sequence's slot comes with each step (meta.decode_state_slots,
PrefillGroup.state_slot; meta.decode_state_fresh); a chunk starting at position 0 starts from zeros, so a slot needs no
clearing when it changes hands. The paged pool holds the full-attention layers only (kv index =
their order among themselves).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros, paged_attention
from lantern.backends.torch.layers import Attention, apply_rotary, feed_forward
from lantern.backends.torch.models import llama
from lantern.backends.torch.models.gemma import GemmaRMSNorm
from lantern.backends.torch.parallel import TPGroup


class GatedAttention(Attention):
    """Each head's query and output gate come from q_proj side by side; output times sigmoid(gate)."""

    def __init__(self, cfg: ModelConfig, kv_index: int, tp: TPGroup):
        super().__init__(cfg, kv_index, tp, norm=GemmaRMSNorm)  # layer_idx: its K/V's place in the pool
        self.splits[0] *= 2
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.splits), bias=False)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        t, hd = x.shape[0], self.head_dim
        qg, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        qg = qg.view(t, self.n_heads, 2 * hd)
        q, gate = qg[..., :hd].contiguous(), qg[..., hd:].reshape(t, -1)
        q = apply_rotary(self.q_norm(q)[0], meta.cos, meta.sin, False, meta.rope_cache)
        k = apply_rotary(self.k_norm(k.view(t, self.n_kv, hd))[0], meta.cos, meta.sin, False, meta.rope_cache)
        out = paged_attention(q, k, v.view(t, self.n_kv, hd), meta, self.layer_idx, self.scale)
        return self.o_proj(out.reshape(t, -1) * torch.sigmoid(gate))


class GatedNorm(nn.Module):
    """RMSNorm of each head's output times its weight, then times SiLU(z) (transformers' order)."""

    def __init__(self, dim: int, eps: float, fp32: bool = False):
        """fp32: the weight applied in float32 and the product rounded once (Lara Mini's), not after the norm."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps, self.fp32 = eps, fp32

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight.float() if self.fp32 else self.weight
        return (weight * (normed if self.fp32 else normed.to(x.dtype)) * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    keep_float32 = ("A_log",)  # as the checkpoints store it (and mlx_lm, llama.cpp keep it): exp() of it decays

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        la = cfg.linear_attn
        self.state_index = state_index  # its place among the linear layers' states
        self.nk, self.nv, self.dk, self.dv = la.num_k_heads, la.num_v_heads, la.k_dim, la.v_dim
        self.fused_qkvz, self.fused_ba, self.tiled = la.fused_qkvz, la.fused_ba, la.v_heads_tiled
        d, key, value = cfg.hidden_size, la.num_k_heads * la.k_dim, la.num_v_heads * la.v_dim
        if self.fused_qkvz:  # Qwen3-Next: per key head [q, k, v..., z...]
            self.in_proj_qkvz = nn.Linear(d, 2 * key + 2 * value, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(d, 2 * key + value, bias=False)
            self.in_proj_z = nn.Linear(d, value, bias=False)
        if self.fused_ba:  # Qwen3-Next: per key head [b..., a...]
            self.in_proj_ba = nn.Linear(d, 2 * la.num_v_heads, bias=False)
        else:
            self.in_proj_b = nn.Linear(d, la.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(d, la.num_v_heads, bias=False)
        self.conv1d = gated_delta.Conv(la.conv_dim, la.conv_kernel)
        self.dt_bias = nn.Parameter(torch.ones(la.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(la.num_v_heads), requires_grad=False)
        self.norm = GatedNorm(la.v_dim, la.norm_eps or cfg.rms_norm_eps, la.norm_fp32)
        self.beta_scale = la.beta_scale
        self.out_proj = nn.Linear(value, d, bias=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(q/k/v for the convolution [T, conv_dim], z [T, Hv, dv], b [T, Hv], a [T, Hv])."""
        t, r = x.shape[0], self.nv // self.nk
        if self.fused_qkvz:
            q, k, v, z = (
                self.in_proj_qkvz(x).view(t, self.nk, -1).split([self.dk, self.dk, r * self.dv, r * self.dv], -1)
            )
            mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        else:
            mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)
        if self.fused_ba:
            b, a = self.in_proj_ba(x).view(t, self.nk, 2 * r).split([r, r], dim=-1)
        else:
            b, a = self.in_proj_b(x), self.in_proj_a(x)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)

    def _heads(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Convolved q/k/v [N, conv_dim] -> float32 q, k [N, Hv, dk] (l2-normed, q scaled), v, g, beta."""
        n, key, r = mixed.shape[0], self.nk * self.dk, self.nv // self.nk
        q, k, v = mixed.split([key, key, self.nv * self.dv], dim=-1)
        q = gated_delta.l2norm(q.float().view(n, self.nk, self.dk)) * self.dk**-0.5
        k = gated_delta.l2norm(k.float().view(n, self.nk, self.dk))
        if r > 1 and self.tiled:  # value head i reads key head i % key heads (llama.cpp's Qwen3.5 order)
            q, k = q.repeat(1, r, 1), k.repeat(1, r, 1)
        elif r > 1:  # each key head serves r consecutive value heads
            q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        beta = b.sigmoid().float()
        return q, k, v.float().view(n, self.nv, self.dv), g, beta if self.beta_scale == 1.0 else beta * self.beta_scale

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, state: RecurrentState) -> torch.Tensor:
        mixed, z, b, a = self._project(x)
        conv_w = self.conv1d.weight
        windows, matrices = state.conv[self.state_index], state.ssm[self.state_index]
        out = torch.empty(x.shape[0], self.nv, self.dv, dtype=torch.float32, device=x.device)
        heads = lambda conv, rows: self._heads(conv, b[rows], a[rows])
        step, chunk = gated_delta.recurrent_step, gated_delta.chunked
        gated_delta.over_batch(meta, mixed, conv_w, windows, matrices, heads, step, chunk, out)
        return self.out_proj(self.norm(out.to(x.dtype), z).reshape(x.shape[0], -1))


class RecurrentState:
    """Per linear layer: convolution windows [slots, conv_dim, K-1] and delta-rule states [slots, Hv, dk, dv]."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        la = cfg.linear_attn
        n = sum(la.linear_layers)
        # Committed as written on a CPU (attention.lazy_zeros): slots are handed out lowest first, so memory
        # follows the most sequences that ran at once, not max_num_seqs.
        self.conv = [lazy_zeros((slots, la.conv_dim, la.conv_kernel - 1), dtype, device) for _ in range(n)]
        self.ssm = [lazy_zeros((slots, la.num_v_heads, la.k_dim, la.v_dim), torch.float32, device) for _ in range(n)]


def state_bytes_per_seq(cfg: ModelConfig, dtype: torch.dtype) -> int:
    conv, ssm = cfg.linear_attn.state_elements()
    return sum(cfg.linear_attn.linear_layers) * (conv * dtype.itemsize + ssm * 4)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        if kinds[layer_idx]:
            self.linear_attn = GatedDeltaNet(cfg, sum(kinds[:layer_idx]))
        else:
            self.self_attn = GatedAttention(cfg, layer_idx - sum(kinds[:layer_idx]), tp)
        self.mlp = feed_forward(cfg, layer_idx, tp)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: RecurrentState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "linear_attn", None)
        h = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = RecurrentState
    final_norm = GemmaRMSNorm

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        return state_bytes_per_seq(self.cfg, dtype)
