"""Granite 4.0-H decoder in torch over a flattened token batch (maths in app/models/family_mamba2.py and
family_granite.py; the same layout as the MLX file): Mamba-2 mixer layers keeping a state per sequence
(a state slot, as Qwen3-Next's layers: models/qwen3_next.py says how slots work) among Granite's attention
layers over the paged pool, which holds the attention layers only; every layer's MLP is the dense
shared_mlp, plus GraniteMoE's routed experts beside it when the model has them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta, mamba2
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import MLP, Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class MambaState:
    """Per Mamba layer: convolution windows [slots, conv_dim, K-1] (model dtype) and SSM states
    [slots, H, P, N] (float32), committed as written (attention.lazy_zeros)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        m = cfg.mamba
        n = sum(m.mamba_layers)
        self.conv = [lazy_zeros((slots, m.conv_dim, m.conv_kernel - 1), dtype, device) for _ in range(n)]
        self.ssm = [lazy_zeros((slots, m.num_heads, m.head_dim, m.state_size), torch.float32, device) for _ in range(n)]


class GroupedGatedNorm(nn.Module):
    """RMSNorm of y * SiLU(z) over each of `groups` channel groups, times the weight (float32 inside); with
    before_gate (Falcon-H1's mamba_norm_before_gate) RMSNorm(y) * SiLU(z)."""

    def __init__(self, dim: int, groups: int, eps: float, before_gate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.groups, self.eps, self.before_gate = groups, eps, before_gate

    def forward(self, y: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        gate = F.silu(z.float())
        h = (y.float() if self.before_gate else y.float() * gate).view(y.shape[0], self.groups, -1)
        h = self.weight.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(y.shape[0], -1)
        return (h * gate if self.before_gate else h).to(dtype)


class Mamba2Mixer(nn.Module):
    keep_float32 = ("A_log",)  # exp() of it decays the state: kept as stored

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        m = cfg.mamba
        self.m, self.state_index = m, state_index  # its place among the Mamba layers' states
        self.in_proj = nn.Linear(cfg.hidden_size, m.inner + m.conv_dim + m.num_heads, bias=m.proj_bias)
        self.conv1d = gated_delta.Conv(m.conv_dim, m.conv_kernel)
        if m.conv_bias:
            self.conv1d.bias = nn.Parameter(torch.zeros(m.conv_dim), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.ones(m.num_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(m.num_heads), requires_grad=False)
        self.D = nn.Parameter(torch.ones(m.num_heads), requires_grad=False)
        if m.norm != "none":  # (Falcon-H1 without mamba_rms_norm: y * SiLU(z), no weight)
            self.norm = GroupedGatedNorm(m.inner, m.groups, m.norm_eps, before_gate=m.norm == "before_gate")
        self.out_proj = nn.Linear(m.inner, cfg.hidden_size, bias=m.proj_bias)
        self.in_spans = m.in_spans()  # Falcon-H1's μP multipliers of in_proj's parts

    def _ssm_inputs(self, xbc: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Convolved xBC [L, conv_dim] and raw dt [L, H] -> x [L, H, P], dt (softplus'd, clamped), B, C [L, G, N]."""
        m, n = self.m, xbc.shape[0]
        x, b, c = xbc.split([m.inner, m.groups * m.state_size, m.groups * m.state_size], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*m.dt_limit)
        shape = (n, m.groups, m.state_size)
        return x.reshape(n, m.num_heads, m.head_dim), dt, b.reshape(shape), c.reshape(shape)

    def forward(self, h: torch.Tensor, meta: TorchAttentionMetadata, state: MambaState) -> torch.Tensor:
        m, t = self.m, h.shape[0]
        projected = self.in_proj(h)
        for start, end, multiplier in self.in_spans:  # (in place: a fresh tensor)
            projected[:, start:end].mul_(multiplier)
        z, xbc, dt = projected.split([m.inner, m.conv_dim, m.num_heads], dim=-1)
        w, bias = self.conv1d.weight, getattr(self.conv1d, "bias", None)
        windows, ssm = state.conv[self.state_index], state.ssm[self.state_index]
        a, d = -self.A_log.float().exp(), self.D.float()
        y = torch.empty(t, m.num_heads, m.head_dim, dtype=torch.float32, device=h.device)
        rows = meta.decode_token_idx
        if rows is not None:
            slots = meta.decode_state_slots
            fresh = meta.decode_state_fresh[:, None, None]  # a one-token prompt starts from zeros
            conv, windows[slots] = gated_delta.conv_step(xbc[rows], windows[slots].masked_fill(fresh, 0), w, bias)
            x, step_dt, b, c = self._ssm_inputs(conv, dt[rows])
            y[rows], ssm[slots] = mamba2.step(x, step_dt, a, b, c, d, ssm[slots].masked_fill(fresh[..., None], 0))
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.ctx_len == p.q_end - p.q_start  # the chunk starts at position 0
            window = torch.zeros_like(windows[slot]) if first else windows[slot]
            conv, windows[slot] = gated_delta.conv_chunk(xbc[span], window, w, bias)
            x, chunk_dt, b, c = self._ssm_inputs(conv, dt[span])
            s = torch.zeros_like(ssm[slot]) if first else ssm[slot]
            y[span], ssm[slot] = mamba2.chunked(x, chunk_dt, a, b, c, d, s)
        norm = getattr(self, "norm", None)
        y = y.reshape(t, -1)
        return self.out_proj(norm(y, z, h.dtype) if norm is not None else (y * F.silu(z.float())).to(h.dtype))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.mamba.mamba_layers if cfg.mamba is not None else (False,) * cfg.num_layers  # (granite-4.0-micro)
        if kinds[layer_idx]:
            self.mamba = Mamba2Mixer(cfg, sum(kinds[:layer_idx]))
        else:  # layer_idx: its K/V's place in the pool (attention layers only)
            self.self_attn = Attention(cfg, layer_idx - sum(kinds[:layer_idx]), tp)
        self.shared_mlp = MLP(cfg, tp)  # dense, in every layer
        if cfg.moe is not None:  # GraniteMoE's routed experts beside it (softmax over the top-k logits)
            from lantern.backends.torch.moe import SparseMoE

            self.mlp = SparseMoE(cfg, tp, softmax_after_topk=True)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: MambaState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        mixer = getattr(self, "mamba", None)
        h = mixer(h, meta, state) if mixer is not None else self.self_attn(h, meta)
        h, residual = self.post_attention_layernorm(h * self.residual_multiplier, residual)
        out = self.shared_mlp(h)
        routed = getattr(self, "mlp", None)
        return (out if routed is None else routed(h) + out) * self.residual_multiplier, residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = MambaState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        conv, ssm = self.cfg.mamba.state_elements()  # the SSM state in float32
        return sum(self.cfg.mamba.mamba_layers) * (conv * dtype.itemsize + ssm * 4)
