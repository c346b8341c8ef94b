"""Mamba / Falcon-Mamba decoder in torch over a flattened token batch (maths in app/models/family_mamba.py; the MLX
file has the same layout): Mamba-1 mixers keeping a state per sequence (a state slot, as the Mamba-2 layers of
models/granite_hybrid.py), each under an RMSNorm; no attention, so the paged pool holds no layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta, mamba1
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class MambaState:
    """Per Mamba layer: convolution windows [slots, d_inner, K-1] (model dtype) and SSM states [slots, d_inner, N]
    (float32), committed as written (attention.lazy_zeros)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        m = cfg.mamba1
        n = sum(m.mamba_layers)
        self.conv = [lazy_zeros((slots, m.inner, m.conv_kernel - 1), dtype, device) for _ in range(n)]
        self.ssm = [lazy_zeros((slots, m.inner, m.state_size), torch.float32, device) for _ in range(n)]


def _rms(x: torch.Tensor, eps: float, weight: torch.Tensor | None) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf if weight is None else weight.float() * xf).to(x.dtype)


class Mamba1Mixer(nn.Module):
    keep_float32 = ("A_log",)  # exp() of it decays the state: kept as stored

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        m = cfg.mamba1
        self.m, self.state_index = m, state_index  # its place among the Mamba layers' states
        self.in_proj = nn.Linear(cfg.hidden_size, 2 * m.inner, bias=m.proj_bias)
        self.conv1d = gated_delta.Conv(m.inner, m.conv_kernel)
        if m.conv_bias:
            self.conv1d.bias = nn.Parameter(torch.zeros(m.inner), requires_grad=False)
        if m.heads == 1:
            self.x_proj = nn.Linear(m.inner, m.dt_rank + 2 * m.state_size, bias=False)
            self.dt_proj = nn.Linear(m.dt_rank, m.inner, bias=True)
        else:  # Zamba: each head's x_proj and dt_proj (its checkpoint's names and shapes)
            p = m.inner // m.heads
            self.x_proj_weight = nn.Parameter(torch.zeros(m.heads, m.dt_rank + 2 * m.state_size, p))
            self.dt_proj_weight = nn.Parameter(torch.zeros(m.heads, p, m.dt_rank))
            self.dt_proj_bias = nn.Parameter(torch.zeros(m.heads, p))
        self.A_log = nn.Parameter(torch.zeros(m.inner, m.state_size), requires_grad=False)
        self.D = nn.Parameter(torch.ones(m.inner), requires_grad=False)
        self.out_proj = nn.Linear(m.inner, cfg.hidden_size, bias=m.proj_bias)
        if m.bc_norm == "weighted":  # Jamba's RMSNorms of dt, B and C, with weights
            self.dt_layernorm = RMSNorm(m.dt_rank, m.norm_eps)
            self.b_layernorm = RMSNorm(m.state_size, m.norm_eps)
            self.c_layernorm = RMSNorm(m.state_size, m.norm_eps)

    def _ssm_inputs(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Convolved x [L, d_inner] -> dt [L, d_inner] (softplus'd, float32), B, C [L, N] (heads: [L, heads, N])."""
        m = self.m
        if m.heads > 1:
            return self._head_ssm_inputs(conv)
        dt, b, c = self.x_proj(conv).split([m.dt_rank, m.state_size, m.state_size], dim=-1)
        if m.bc_norm != "none":
            weighted = m.bc_norm == "weighted"
            dt = _rms(dt, m.norm_eps, self.dt_layernorm.weight if weighted else None)
            b = _rms(b, m.norm_eps, self.b_layernorm.weight if weighted else None)
            c = _rms(c, m.norm_eps, self.c_layernorm.weight if weighted else None)
        return F.softplus(self.dt_proj(dt).float()), b, c

    def _head_ssm_inputs(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Zamba's heads: each head's channels give its dt (through its dt_proj), B and C [L, heads, N]."""
        m, rows = self.m, conv.shape[0]
        x = conv.view(rows, m.heads, -1)
        dt, b, c = torch.einsum("lhp,hkp->lhk", x, self.x_proj_weight).split(
            [m.dt_rank, m.state_size, m.state_size], dim=-1
        )
        dt = torch.einsum("lhr,hpr->lhp", dt, self.dt_proj_weight) + self.dt_proj_bias
        return F.softplus(dt.reshape(rows, m.inner).float()), b, c  # (B, C per head: the scans repeat them)

    def forward(self, h: torch.Tensor, meta: TorchAttentionMetadata, state: MambaState) -> torch.Tensor:
        m, t = self.m, h.shape[0]
        x, z = self.in_proj(h).chunk(2, dim=-1)
        w, bias = self.conv1d.weight, getattr(self.conv1d, "bias", None)
        windows, ssm = state.conv[self.state_index], state.ssm[self.state_index]
        a, d = -self.A_log.float().exp(), self.D.float()
        y = torch.empty(t, m.inner, dtype=torch.float32, device=h.device)
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            fresh = meta.decode_state_fresh[:, None, None]  # a one-token prompt starts from zeros
            conv, windows[slots] = gated_delta.conv_step(x[rows], windows[slots].masked_fill(fresh, 0), w, bias)
            dt, b, c = self._ssm_inputs(conv)
            y[rows], ssm[slots] = mamba1.step(conv, dt, a, b, c, d, ssm[slots].masked_fill(fresh, 0))
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.ctx_len == p.q_end - p.q_start  # the chunk starts at position 0
            window = torch.zeros_like(windows[slot]) if first else windows[slot]
            conv, windows[slot] = gated_delta.conv_chunk(x[span], window, w, bias)
            dt, b, c = self._ssm_inputs(conv)
            s = torch.zeros_like(ssm[slot]) if first else ssm[slot]
            y[span], ssm[slot] = mamba1.chunked(conv, dt, a, b, c, d, s)
        return self.out_proj((y * F.silu(z.float())).to(h.dtype))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.mamba = Mamba1Mixer(cfg, layer_idx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: MambaState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        return self.mamba(h, meta, state), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        conv, ssm = self.cfg.mamba1.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba1.mamba_layers) * (conv * dtype.itemsize + ssm * 4)
