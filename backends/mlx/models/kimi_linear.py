"""Kimi Linear decoder in MLX over a flattened token batch (maths in app/models/family_kimi_linear.py; the torch file
has the same layout and says how the recurrent state is kept): Kimi Delta Attention layers with a per-sequence
state, DeepSeek's latent attention (its rope part unrotated) over the paged pool, DeepSeek's mixture.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.base import KVLayout
from lantern.backends.mlx import gated_delta, kimi_delta
from lantern.backends.mlx.layers import MLP
from lantern.backends.mlx.models import deepseek, llama
from lantern.backends.mlx.paged_attention import AttentionMetadata


class KimiDeltaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        kda = cfg.linear_attn
        self.state_index, self.h, self.dk = state_index, kda.num_heads, kda.head_dim
        d, width = cfg.hidden_size, kda.width
        self.q_proj = nn.Linear(d, width, bias=False)
        self.k_proj = nn.Linear(d, width, bias=False)
        self.v_proj = nn.Linear(d, width, bias=False)
        self.conv1d = gated_delta.Conv(kda.conv_dim, kda.conv_kernel)  # q, k, v's kernels joined while loading
        self._full_rank, self._gate_bound = kda.full_rank, kda.gate_bound
        if kda.full_rank:  # (Ling 3.0)
            self.f_proj = nn.Linear(d, width, bias=False)
            self.g_proj = nn.Linear(d, width, bias=False)
        else:
            self.f_a_proj = nn.Linear(d, self.dk, bias=False)
            self.f_b_proj = nn.Linear(self.dk, width, bias=False)
            self.g_a_proj = nn.Linear(d, self.dk, bias=False)
            self.g_b_proj = nn.Linear(self.dk, width, bias=False)
        self.dt_bias = mx.zeros((width,))
        self.A_log = mx.zeros((self.h,))
        self.b_proj = nn.Linear(d, self.h, bias=False)
        self.o_norm = nn.RMSNorm(self.dk, eps=cfg.rms_norm_eps)
        self.o_proj = nn.Linear(width, d, bias=False)

    def _heads(self, conv: mx.array, x: mx.array) -> tuple[mx.array, ...]:
        """Convolved q/k/v and the layer's input rows -> float32 q, k (l2-normed, q scaled), v, g [N, H, dk], beta."""
        n, h, dk = conv.shape[0], self.h, self.dk
        q, k, v = (t.astype(mx.float32).reshape(n, h, dk) for t in mx.split(conv, 3, axis=-1))
        q, k = gated_delta.l2norm(q) * dk**-0.5, gated_delta.l2norm(k)
        f = self.f_proj(x) if self._full_rank else self.f_b_proj(self.f_a_proj(x))
        f = (f.astype(mx.float32) + self.dt_bias.astype(mx.float32)).reshape(n, h, dk)
        rate = mx.exp(self.A_log.astype(mx.float32))[:, None]
        if self._gate_bound is None:
            g = -rate * nn.softplus(f)
        else:  # (Ling 3.0's bounded gate: the log-decay stays within (gate_bound, 0))
            g = self._gate_bound * mx.sigmoid(rate * f)
        return q, k, v, g, mx.sigmoid(self.b_proj(x)).astype(mx.float32)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: RecurrentState) -> mx.array:
        mixed = mx.concatenate([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        conv_w = self.conv1d.weight
        i = self.state_index
        windows, matrices = state.conv[i], state.ssm[i]
        heads = lambda conv, rows: self._heads(conv, x[rows])
        step, chunk = kimi_delta.recurrent_step, kimi_delta.chunked
        out, state.conv[i], state.ssm[i] = gated_delta.over_batch(
            meta, mixed, conv_w, windows, matrices, heads, step, chunk
        )
        t = x.shape[0]
        gate = self.g_proj(x) if self._full_rank else self.g_b_proj(self.g_a_proj(x))
        gate = gate.astype(mx.float32).reshape(t, self.h, self.dk)
        normed = mx.fast.rms_norm(
            out.astype(x.dtype).astype(mx.float32), self.o_norm.weight.astype(mx.float32), self.o_norm.eps
        )
        return self.o_proj((normed * mx.sigmoid(gate)).astype(x.dtype).reshape(t, -1))


class RecurrentState:
    """Per KDA layer: convolution windows [slots, 3 x width, K-1] and states [slots, H, dk, dv]."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: mx.Dtype):
        kda = cfg.linear_attn
        n, shape = sum(kda.linear_layers), (slots, kda.num_heads, kda.head_dim, kda.head_dim)
        self.conv = [mx.zeros((slots, kda.conv_dim, kda.conv_kernel - 1), dtype=dtype) for _ in range(n)]
        self.ssm = [mx.zeros(shape, dtype=mx.float32) for _ in range(n)]

    def arrays(self) -> list[mx.array]:
        return self.conv + self.ssm


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kinds = cfg.linear_attn.linear_layers
        if kinds[layer_idx]:
            self.self_attn = KimiDeltaAttention(cfg, sum(kinds[:layer_idx]))
        else:
            self.self_attn = deepseek.MLAttention(cfg, layer_idx - sum(kinds[:layer_idx]))
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        self.mlp = deepseek.DeepSeekMoE(cfg) if sparse else MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, meta: AttentionMetadata, state: RecurrentState) -> mx.array:
        h, attn = self.input_layernorm(x), self.self_attn
        h = x + (attn(h, meta, state) if isinstance(attn, KimiDeltaAttention) else attn(h, meta))
        return h + self.mlp(self.post_attention_layernorm(h))


class CausalLM(llama.RecurrentCausalLM):
    decoder_layer = DecoderLayer
    state_cls = RecurrentState

    def state_bytes_per_seq(self, dtype: mx.Dtype) -> int:
        conv, ssm = self.cfg.linear_attn.state_elements()
        return sum(self.cfg.linear_attn.linear_layers) * (conv * dtype.size + ssm * 4)

    def finish_load(self, dtype: mx.Dtype) -> None:
        """Each latent-attention layer's quantized kv_b_proj made dense once (deepseek.MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            if isinstance(layer.self_attn, deepseek.MLAttention):
                layer.self_attn.dense_kv_b(dtype)

    @staticmethod
    def kv_layout(cfg: ModelConfig) -> KVLayout:
        return deepseek.CausalLM.kv_layout(cfg)
