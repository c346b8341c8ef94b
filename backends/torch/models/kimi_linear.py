"""Kimi Linear decoder in torch over a flattened token batch (maths in app/models/family_kimi_linear.py; the MLX file
has the same layout): Kimi Delta Attention layers keeping a recurrent state per sequence, DeepSeek's latent
attention (deepseek.MLAttention, its rope part unrotated) over the paged pool in the others, DeepSeek's mixture.

The state is allocated by the runner (allocate_state), one slot per sequence the engine may run: per KDA layer the
convolutions' last K-1 inputs (q, k, v side by side, model dtype) and the [heads, d_k, d_v] state (float32); a
chunk starting at position 0 starts from zeros (as qwen3_next.py). The pool holds the latent-attention layers only
(kv index = their order among themselves).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.base import KVLayout
from lantern.backends.torch import gated_delta, kimi_delta
from lantern.backends.torch.attention import TorchAttentionMetadata, lazy_zeros
from lantern.backends.torch.layers import MLP, RMSNorm
from lantern.backends.torch.models import deepseek, llama
from lantern.backends.torch.parallel import TPGroup


class KimiDeltaAttention(nn.Module):
    keep_float32 = ("A_log", "dt_bias")  # as the checkpoints store them (transformers keeps dt_bias in float32)

    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        kda = cfg.linear_attn
        self.state_index, self.h, self.dk = state_index, kda.num_heads, kda.head_dim
        d, width = cfg.hidden_size, kda.width
        self.qkv_proj = nn.Linear(d, 3 * width, bias=False)  # q, k, v stacked by weights.py
        self.conv1d = gated_delta.Conv(kda.conv_dim, kda.conv_kernel)  # q, k, v's kernels joined while loading
        self.full_rank, self.gate_bound = kda.full_rank, kda.gate_bound
        if kda.full_rank:  # (Ling 3.0)
            self.f_proj = nn.Linear(d, width, bias=False)
            self.g_proj = nn.Linear(d, width, bias=False)
        else:
            self.f_a_proj = nn.Linear(d, self.dk, bias=False)
            self.f_b_proj = nn.Linear(self.dk, width, bias=False)
            self.g_a_proj = nn.Linear(d, self.dk, bias=False)
            self.g_b_proj = nn.Linear(self.dk, width, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(width), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.h), requires_grad=False)
        self.b_proj = nn.Linear(d, self.h, bias=False)
        self.o_norm = RMSNorm(self.dk, cfg.rms_norm_eps)
        self.o_proj = nn.Linear(width, d, bias=False)

    def _heads(self, conv: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Convolved q/k/v [N, 3 x width] and the layer's input rows [N, d] -> float32 q, k (l2-normed, q scaled),
        v [N, H, dk], the per-channel log-decay g [N, H, dk] and beta [N, H]."""
        n, h, dk = conv.shape[0], self.h, self.dk
        q, k, v = (t.float().view(n, h, dk) for t in conv.chunk(3, dim=-1))
        q, k = gated_delta.l2norm(q) * dk**-0.5, gated_delta.l2norm(k)
        f = (self.f_proj(x) if self.full_rank else self.f_b_proj(self.f_a_proj(x))).float() + self.dt_bias.float()
        rate = self.A_log.float().exp()[:, None]
        if self.gate_bound is None:
            g = -rate * F.softplus(f.view(n, h, dk))
        else:  # (Ling 3.0's bounded gate: the log-decay stays within (gate_bound, 0))
            g = self.gate_bound * torch.sigmoid(rate * f.view(n, h, dk))
        return q, k, v, g, self.b_proj(x).sigmoid().float()

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, state: RecurrentState) -> torch.Tensor:
        mixed, conv_w = self.qkv_proj(x), self.conv1d.weight
        windows, matrices = state.conv[self.state_index], state.ssm[self.state_index]
        out = torch.empty(x.shape[0], self.h, self.dk, dtype=torch.float32, device=x.device)
        heads = lambda conv, rows: self._heads(conv, x[rows])
        step, chunk = kimi_delta.recurrent_step, kimi_delta.chunked
        gated_delta.over_batch(meta, mixed, conv_w, windows, matrices, heads, step, chunk, out)
        gate = (self.g_proj(x) if self.full_rank else self.g_b_proj(self.g_a_proj(x))).float()
        gate = gate.view(x.shape[0], self.h, self.dk)
        normed = F.rms_norm(out.to(x.dtype).float(), (self.dk,), self.o_norm.weight.float(), self.o_norm.eps)
        return self.o_proj((normed * gate.sigmoid()).to(x.dtype).reshape(x.shape[0], -1))


class RecurrentState:
    """Per KDA layer: convolution windows [slots, 3 x width, K-1] and states [slots, H, dk, dv]."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device):
        kda = cfg.linear_attn
        n, shape = sum(kda.linear_layers), (slots, kda.num_heads, kda.head_dim, kda.head_dim)
        # Committed as written on a CPU (attention.lazy_zeros): memory follows the sequences that ran at once.
        self.conv = [lazy_zeros((slots, kda.conv_dim, kda.conv_kernel - 1), dtype, device) for _ in range(n)]
        self.ssm = [lazy_zeros(shape, torch.float32, device) for _ in range(n)]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        if kinds[layer_idx]:
            self.self_attn = KimiDeltaAttention(cfg, sum(kinds[:layer_idx]))
        else:
            self.self_attn = deepseek.MLAttention(cfg, layer_idx - sum(kinds[:layer_idx]))
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        self.mlp = deepseek.DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata, state: RecurrentState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        attn = self.self_attn
        h = attn(h, meta, state) if isinstance(attn, KimiDeltaAttention) else attn(h, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = RecurrentState

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:
            raise ValueError("tensor parallelism is not implemented for Kimi Linear; use --tensor-parallel-size 1")
        super().__init__(cfg, tp)

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        conv, ssm = self.cfg.linear_attn.state_elements()
        return sum(self.cfg.linear_attn.linear_layers) * (conv * dtype.itemsize + ssm * 4)

    def finish_load(self, dtype: torch.dtype) -> None:
        """Each latent-attention layer's quantized kv_b_proj made dense once (deepseek.MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            if isinstance(layer.self_attn, deepseek.MLAttention):
                layer.self_attn.dense_kv_b(dtype)

    @staticmethod
    def kv_layout(cfg: ModelConfig) -> KVLayout:
        return deepseek.CausalLM.kv_layout(cfg)
