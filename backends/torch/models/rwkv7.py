"""RWKV-7 in torch over a flattened token batch (maths in app/models/family_rwkv7.py; the MLX file has the same
layout): time and channel mixes under LayerNorms, each sequence's token shifts and wkv states in a state slot; no
attention, so the paged pool holds no layer. Parameter names are flash-linear-attention's (its embedding renamed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch import rwkv7
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup, parallel_embed

DECAY_SCALE = 0.606531  # e^-0.5: w = exp(-e^-0.5 sigmoid(.)), each channel's decay in (e^-0.607, 1)


class Rwkv7State:
    """Per layer: the time and channel mixes' last inputs [slots, D] (model dtype) and the wkv states
    [slots, H, Dh, Dh] (float32), committed as written (attention.lazy_zeros)."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        r, d, n = cfg.rwkv7, cfg.hidden_size, cfg.num_layers
        self.att_shift = [lazy_zeros((slots, d), dtype, device) for _ in range(n)]
        self.ffn_shift = [lazy_zeros((slots, d), dtype, device) for _ in range(n)]
        self.wkv = [lazy_zeros((slots, r.heads, r.head_dim, r.head_dim), torch.float32, device) for _ in range(n)]


class LoRA(nn.Module):
    """lora.0 (no bias), an activation, lora.2 (bias unless the gate's): the names of flash-linear-attention's."""

    def __init__(self, width: int, rank: int, act: nn.Module, bias: bool = True):
        super().__init__()
        self.lora = nn.ModuleList([nn.Linear(width, rank, bias=False), act, nn.Linear(rank, width, bias=bias)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora[2](self.lora[1](self.lora[0](x)))


def _vector(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class TimeMixing(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        r, d = cfg.rwkv7, cfg.hidden_size
        self.layer_idx, self.heads, self.head_dim, self.gn_eps = layer_idx, r.heads, r.head_dim, r.group_norm_eps
        for mu in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            setattr(self, mu, _vector(d))
        for per_head in ("k_k", "k_a", "r_k"):
            setattr(self, per_head, _vector(r.heads, r.head_dim))
        self.r_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.w_lora = LoRA(d, r.decay_rank, nn.Tanh())
        if layer_idx > 0:
            self.v_lora = LoRA(d, r.v_rank, nn.Identity())
        self.a_lora = LoRA(d, r.a_rank, nn.Identity())
        self.g_lora = LoRA(d, r.gate_rank, nn.Sigmoid(), bias=False)
        self.g_norm = nn.Module()
        self.g_norm.weight, self.g_norm.bias = _vector(r.heads, r.head_dim), _vector(r.heads, r.head_dim)

    def forward(
        self, x: torch.Tensor, meta: TorchAttentionMetadata, state: Rwkv7State, v_first: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t, heads = x.shape[0], (self.heads, self.head_dim)
        xx = rwkv7.token_shift(x, meta, state.att_shift[self.layer_idx]) - x
        xr, xw, xk, xv, xa, xg = (
            torch.addcmul(x, xx, mu) for mu in (self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g)
        )
        r, k, v = self.r_proj(xr).view(t, *heads), self.k_proj(xk).view(t, *heads), self.v_proj(xv).view(t, *heads)
        iclr = torch.sigmoid(self.a_lora(xa)).view(t, *heads)
        if v_first is None:  # layer 0: its values are every later layer's v_first
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(self.v_lora(xv)).view(t, *heads)
        w = torch.exp(-DECAY_SCALE * torch.sigmoid(self.w_lora(xw).float())).view(t, *heads)
        kk = k * self.k_k
        kk = kk / kk.norm(dim=-1, keepdim=True).clamp_min(1e-7)
        k = k * (1 + (iclr - 1) * self.k_a)
        y = rwkv7.wkv(meta, state.wkv[self.layer_idx], r, w, k, v, -kk, kk * iclr).to(x.dtype)
        y = F.layer_norm(y, (self.head_dim,), eps=self.gn_eps) * self.g_norm.weight + self.g_norm.bias
        y = y + (r * k * self.r_k).sum(-1, keepdim=True) * v
        return self.o_proj(y.reshape(t, -1) * self.g_lora(xg)), v_first


class ChannelMixing(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.x_k = _vector(cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.value = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, state: Rwkv7State) -> torch.Tensor:
        xk = torch.addcmul(x, rwkv7.token_shift(x, meta, state.ffn_shift[self.layer_idx]) - x, self.x_k)
        return self.value(torch.relu(self.key(xk)).square())


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rwkv7.norm_eps
        self.layer_idx = layer_idx
        if layer_idx == 0:
            self.pre_norm = nn.LayerNorm(d, eps=eps)
        self.attn_norm, self.ffn_norm = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.attn, self.ffn = TimeMixing(cfg, layer_idx), ChannelMixing(cfg, layer_idx)

    def forward(
        self, x: torch.Tensor, meta: TorchAttentionMetadata, state: Rwkv7State, v_first: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_idx == 0:
            x = self.pre_norm(x)
        h, v_first = self.attn(self.attn_norm(x), meta, state, v_first)
        h = x + h
        return h + self.ffn(self.ffn_norm(h), meta, state), v_first


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    final_norm = nn.LayerNorm  # (called with (hidden_size, eps))
    state_cls = Rwkv7State

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        shift, wkv = self.cfg.rwkv7.state_elements(self.cfg.hidden_size)  # the wkv state in float32
        return self.cfg.num_layers * (shift * dtype.itemsize + wkv * 4)

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        h, v_first = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size), None
        for layer in self.model.layers:
            h, v_first = layer(h, meta, self.state, v_first)
        return self.model.norm(h[rows])
