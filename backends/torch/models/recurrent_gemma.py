"""RecurrentGemma (Griffin) in torch over a flattened token batch (maths in app/models/family_recurrent_gemma.py; the
MLX file has the same layout): Gemma's residual blocks whose temporal block is local attention over the paged pool
(attention layers only) or an RG-LRU recurrent block keeping a state per sequence (a state slot: the
convolution's last inputs and the recurrence, as granite_hybrid's Mamba layers keep theirs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import gated_delta
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import MLP, Attention
from lantern.backends.torch.models import gemma, llama
from lantern.backends.torch.parallel import TPGroup

CHUNK = 64  # tokens per block of the prefill scan (a [CHUNK, CHUNK, width] decay table each)


class LRUState:
    """Per recurrent layer: convolution windows [slots, width, K-1] (model dtype) and recurrences [slots, width]
    (float32), committed as written (attention.lazy_zeros)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        r = cfg.rglru
        n = sum(r.recurrent_layers)
        self.conv = [lazy_zeros((slots, r.width, r.conv_kernel - 1), dtype, device) for _ in range(n)]
        self.ssm = [lazy_zeros((slots, r.width), torch.float32, device) for _ in range(n)]


def lru_scan(log_a: torch.Tensor, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = a_t h_{t-1} + x_t over one sequence's tokens: log_a, x [L, W] float32, h [W] -> (every h_t, the last).
    Blocks of CHUNK tokens take exp of within-block sums of log a (each at most 0: no overflow)."""
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], CHUNK):
        la, xs = log_a[start : start + CHUNK], x[start : start + CHUNK]
        cum = la.cumsum(0)
        n = cum.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[..., None]
        decay = (cum[:, None, :] - cum[None, :, :]).masked_fill(~causal, float("-inf")).exp()
        block = (decay * xs[None]).sum(1) + cum.exp() * h
        out[start : start + n], h = block, block[-1]
    return out, h


class RGLRU(nn.Module):
    """The gates (block-diagonal: one [width / heads]^2 matrix per head, stored [in, out]) and the decay's
    parameter; gates() gives each token's log a and its normalised input."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        r = cfg.rglru
        block = r.width // r.heads
        self.heads = r.heads
        self.recurrent_param = nn.Parameter(torch.empty(r.width), requires_grad=False)
        self.input_gate_weight = nn.Parameter(torch.empty(r.heads, block, block), requires_grad=False)
        self.input_gate_bias = nn.Parameter(torch.empty(r.heads, block), requires_grad=False)
        self.recurrent_gate_weight = nn.Parameter(torch.empty(r.heads, block, block), requires_grad=False)
        self.recurrent_gate_bias = nn.Parameter(torch.empty(r.heads, block), requires_grad=False)

    def gates(self, u: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u [T, W] (the convolution's output), first [T] (a sequence's first token) -> float32 log a and
        sqrt(1 - a^2) * u * input gate (u * input gate at a first token), both [T, W]."""
        t = u.shape[0]
        blocks = u.view(t, self.heads, -1)
        gate_x = torch.sigmoid(torch.einsum("thi,hio->tho", blocks, self.input_gate_weight) + self.input_gate_bias)
        gate_a = torch.sigmoid(
            torch.einsum("thi,hio->tho", blocks, self.recurrent_gate_weight) + self.recurrent_gate_bias
        )
        # log a, a and the input's multiplier in the model dtype, as transformers computes them (in bfloat16 a slow
        # channel's a rounds to 1 and its multiplier to 0); the scan then runs on that a in float32
        log_a = -8.0 * gate_a.reshape(t, -1) * F.softplus(self.recurrent_param)
        multiplier = torch.sqrt(1 - torch.exp(2 * log_a)).masked_fill(first[:, None], 1.0)
        a = torch.exp(log_a).float().clamp_min(torch.finfo(torch.float32).tiny)  # (a log of 0 would be -inf)
        return a.log(), (u * gate_x.reshape(t, -1) * multiplier.to(u.dtype)).float()


class RecurrentBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        r, d = cfg.rglru, cfg.hidden_size
        self.state_index = state_index  # its place among the recurrent layers' states
        self.linear_y = nn.Linear(d, r.width)
        self.linear_x = nn.Linear(d, r.width)
        self.linear_out = nn.Linear(r.width, d)
        self.conv_1d = gated_delta.Conv(r.width, r.conv_kernel)
        self.conv_1d.bias = nn.Parameter(torch.zeros(r.width), requires_grad=False)
        self.rg_lru = RGLRU(cfg)

    def forward(self, h: torch.Tensor, meta: TorchAttentionMetadata, state: LRUState) -> torch.Tensor:
        y = F.gelu(self.linear_y(h), approximate="tanh")
        u = self.linear_x(h)
        w, bias = self.conv_1d.weight, self.conv_1d.bias
        windows, recurrences = state.conv[self.state_index], state.ssm[self.state_index]
        conv = torch.empty_like(u)
        rows = meta.decode_token_idx
        if rows is not None:
            slots, fresh = meta.decode_state_slots, meta.decode_state_fresh  # a one-token prompt starts from zeros
            window = windows[slots].masked_fill(fresh[:, None, None], 0)
            conv[rows], windows[slots] = gated_delta.conv_step(u[rows], window, w, bias, silu=False)
        starts = []
        for p in meta.prefills:
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            first = p.ctx_len == p.q_end - p.q_start  # the chunk starts at position 0
            starts.append(first)
            window = torch.zeros_like(windows[slot]) if first else windows[slot]
            conv[span], windows[slot] = gated_delta.conv_chunk(u[span], window, w, bias, silu=False)
        log_a, x = self.rg_lru.gates(conv, meta.positions == 0)
        out = torch.empty_like(x)
        if rows is not None:
            prev = recurrences[slots].masked_fill(fresh[:, None], 0)
            out[rows] = recurrences[slots] = log_a[rows].exp() * prev + x[rows]
        for p, first in zip(meta.prefills, starts):
            span, slot = slice(p.q_start, p.q_end), p.state_slot
            start = torch.zeros_like(recurrences[slot]) if first else recurrences[slot]
            out[span], recurrences[slot] = lru_scan(log_a[span], x[span], start)
        return self.linear_out(out.to(h.dtype) * y)


class DecoderLayer(nn.Module):
    """Gemma's residual block: temporal_pre_norm, the temporal block, channel_pre_norm, the biased GeGLU MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.rglru.recurrent_layers
        before = sum(kinds[:layer_idx])
        if kinds[layer_idx]:
            self.temporal_block = RecurrentBlock(cfg, before)
        else:  # its K/V's place in the pool (attention layers only)
            self.temporal_block = Attention(cfg, layer_idx - before, tp, o_bias=True)
        self.recurrent = kinds[layer_idx]
        self.mlp_block = MLP(cfg, tp, bias=True)
        self.temporal_pre_norm = gemma.GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.channel_pre_norm = gemma.GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: LRUState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.temporal_pre_norm(x, residual)
        h = self.temporal_block(h, meta, state) if self.recurrent else self.temporal_block(h, meta)
        h, residual = self.channel_pre_norm(h, residual)
        return self.mlp_block(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = gemma.GemmaRMSNorm
    state_cls = LRUState

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        conv, recurrence = self.cfg.rglru.state_elements()  # the recurrence in float32
        return sum(self.cfg.rglru.recurrent_layers) * (conv * dtype.itemsize + recurrence * 4)
