"""Building blocks the MLX model files share: attention over the paged pool, the gated MLP.

Each block reads what differs between families from ModelConfig (window, soft-cap, query scale,
q/k norms, activation), so a family's model file only says how the blocks are wired.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention
from lantern.backends.mlx.rope import build_rope

# (gelu: the exact erf GELU of GPT-NeoX and Falcon; relu: OPT's)
ACTIVATIONS = {"silu": nn.silu, "gelu_tanh": nn.gelu_approx, "relu2": nn.relu2, "gelu": nn.gelu, "relu": nn.relu}


def rotary_dim(cfg: ModelConfig) -> int:
    """Leading dims of each head the rope rotates: all of them unless the config's rope carries a
    partial_rotary_factor (GLM-4, Phi-4-mini: int(head_dim * factor), as transformers computes it)."""
    return int(cfg.head_dim * float((cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0)))


class Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        norm: type[nn.Module] = nn.RMSNorm,
        rope_interleaved: bool | None = None,
        o_bias: bool = False,
        sinks: bool = False,
        input_size: int | None = None,
    ):
        """rope_interleaved: the family rotates consecutive pairs (GLM-4), not halves (None: as the config
        says). mlx's rope rotates the first rotary_dim(cfg) dims of each head and passes the rest through.
        o_bias: o_proj has a bias too; sinks: one learned sink logit per head (gpt-oss); input_size: the width
        of x where not hidden_size (Zamba2's shared blocks read [x, embedding])."""
        super().__init__()
        self.layer_idx = layer_idx
        heads = cfg.layer_heads[layer_idx] if cfg.layer_heads else cfg.num_heads  # (Laguna's differ per layer)
        self.n_heads, self.n_kv, self.head_dim = heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim**-0.5
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None
        self.softcap = cfg.attn_softcap
        d, width = cfg.hidden_size, input_size or cfg.hidden_size
        bias = cfg.attention_bias
        # (MiMo-V2-Flash's narrower values: padded to head_dim for the pool and attention, cut before o_proj)
        self.v_dim, self.v_scale = cfg.v_head_dim or self.head_dim, cfg.attn_value_scale
        self.q_proj = nn.Linear(width, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.n_kv * self.v_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, d, bias=o_bias)
        if sinks or cfg.attn_sinks:  # (gpt-oss passes it; Granite Swash's config says it)
            self.sinks = mx.zeros((self.n_heads,))
        self.gated = cfg.attn_output_gate  # the output times a gate of x before o_proj (AFMoE, Laguna, LFM3)
        if self.gated:
            width = self.n_heads if self.gated.endswith("_head") else self.n_heads * self.v_dim  # one per head
            self.gate_proj = nn.Linear(d, width, bias=False)
        if cfg.qk_norm:
            self.q_norm = norm(self.head_dim, eps=cfg.rms_norm_eps)
            self.k_norm = norm(self.head_dim, eps=cfg.rms_norm_eps)
        self.norm_after_rope = cfg.qk_norm_after_rope
        self.reversed = cfg.rope_reversed  # (NanoChat)
        theta, scaling, dims = cfg.rope_theta, cfg.rope_scaling, rotary_dim(cfg)
        if self.window is not None and cfg.local_rope_theta is not None:  # (Gemma 3's, Laguna's own width too)
            theta, scaling, dims = cfg.local_rope_theta, None, cfg.local_rope_dim or dims
        interleaved = cfg.rope_interleaved if rope_interleaved is None else rope_interleaved
        self.rope = build_rope(dims, theta, interleaved, scaling, cfg.max_position_embeddings)
        self.clip = cfg.clip_qkv
        self.temperature = cfg.attn_temperature  # Ministral 3: queries scaled per position
        self.rotates = cfg.rope_layers is None or cfg.rope_layers[layer_idx]  # SmolLM3's NoPE layers do not
        # BLOOM / MPT's ALiBi slopes (a leading _: not a parameter)
        self._alibi = None if cfg.alibi_slopes is None else mx.array(cfg.alibi_slopes, dtype=mx.float32)
        if cfg.sub_norms:  # BitNet: the output normed before o_proj
            self.attn_sub_norm = nn.RMSNorm(self.n_heads * self.v_dim, eps=cfg.rms_norm_eps)

    def __call__(
        self,
        x: mx.array,
        meta: AttentionMetadata,
        kv_layer: int | None = None,
        qkv_delta: tuple[mx.array, ...] | None = None,
    ) -> mx.array:
        """kv_layer: the pool layer this call reads and writes where not its own (HRM-Text: each stack pass keeps
        its K/V). qkv_delta: (q, k, v) terms added to the projections (Zamba2's per-layer adapters on a shared
        block)."""
        t = x.shape[0]
        q, k, v = self.qkv(x, meta, qkv_delta)
        sinks = self.get("sinks")
        out = paged_attention(
            q,
            k,
            v,
            meta,
            self.layer_idx if kv_layer is None else kv_layer,
            self.scale,
            window=self.window,
            softcap=self.softcap,
            sinks=sinks,
            alibi=self._alibi,
        )
        if self.v_dim != self.head_dim:
            out = out[..., : self.v_dim]
        out = out.reshape(t, -1) if not self.gated else output_gate(self.gated, out, self.gate_proj(x))
        if "attn_sub_norm" in self:
            out = self.attn_sub_norm(out)
        return self.o_proj(out)

    def qkv(
        self, x: mx.array, meta: AttentionMetadata, qkv_delta: tuple[mx.array, ...] | None = None
    ) -> tuple[mx.array, mx.array, mx.array]:
        """This step's q [T, H, D] and k / v [T, KVH, D] as attention reads them: projected, normed and rotated
        (qkv_delta: as __call__'s)."""
        t = x.shape[0]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if qkv_delta is not None:
            q, k, v = q + qkv_delta[0], k + qkv_delta[1], v + qkv_delta[2]
        q = q.reshape(t, self.n_heads, self.head_dim)
        k = k.reshape(t, self.n_kv, self.head_dim)
        v = v.reshape(t, self.n_kv, self.v_dim)
        if self.clip is not None:  # (OLMo 1)
            q, k, v = (mx.clip(a, -self.clip, self.clip) for a in (q, k, v))
        if self.v_scale != 1.0:
            v = v * self.v_scale
        if self.v_dim != self.head_dim:
            v = mx.pad(v, [(0, 0), (0, 0), (0, self.head_dim - self.v_dim)])
        norm_after = self.norm_after_rope
        if hasattr(self, "q_norm") and not norm_after:
            q, k = self.q_norm(q), self.k_norm(k)
        # Every token has its own position: treat tokens as a batch of length-1 sequences so
        # rope takes one offset per token.
        if self.rotates:  # (NanoChat's rope turns the other way round: the angle of -position)
            at = -meta.positions if self.reversed else meta.positions
            q = self.rope(q[:, :, None, :], offset=at)[:, :, 0, :]
            k = self.rope(k[:, :, None, :], offset=at)[:, :, 0, :]
        if hasattr(self, "q_norm") and norm_after:  # (Hunyuan)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.temperature is not None:
            q = q * query_temperature(self.temperature, meta.positions, q.dtype)
        return q, k, v


def output_gate(kind: str, out: mx.array, gate: mx.array) -> mx.array:
    """Attention's output [T, H, D] times its gate, flattened to [T, H * D]: sigmoid per channel (AFMoE) or per head
    (LFM3, in the output's dtype as transformers computes it); softplus per channel or per head (Laguna, in float32
    as transformers computes it, then in the output's dtype)."""
    t = out.shape[0]
    if kind == "sigmoid":
        return out.reshape(t, -1) * mx.sigmoid(gate)
    if kind == "sigmoid_head":
        return (out * mx.sigmoid(gate)[..., None]).reshape(t, -1)
    g = nn.softplus(gate.astype(mx.float32)).astype(out.dtype)
    return (out * g[..., None]).reshape(t, -1) if kind == "softplus_head" else out.reshape(t, -1) * g


def query_temperature(temp: Any, positions: mx.array, dtype: mx.Dtype) -> mx.array:
    """Llama 4's query scale at each token's position, [T, 1, 1] in the queries' dtype: float32
    1 + beta * log(1 + floor((position + offset) / length)) as transformers computes it, then cast (temp:
    family_ministral.AttnTemperature). A few lazy ops on [T] per layer: MLX's metadata has no
    per-step cache to share them through."""
    steps = mx.floor((positions.astype(mx.float32) + temp.offset) / temp.length)
    return (1 + temp.beta * mx.log(1 + steps)).astype(dtype)[:, None, None]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None, bias: bool = False):
        """bias: the three projections have biases (RecurrentGemma's)."""
        super().__init__()
        inner = intermediate_size or cfg.intermediate_size
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = nn.Linear(cfg.hidden_size, inner, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, inner, bias=bias)
        self.down_proj = nn.Linear(inner, cfg.hidden_size, bias=bias)
        if cfg.sub_norms:  # BitNet: the product normed before down_proj
            self.ffn_sub_norm = nn.RMSNorm(inner, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        act = self.act(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(self.ffn_sub_norm(act) if "ffn_sub_norm" in self else act)


def feed_forward(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The layer's MLP: a mixture of experts where the config makes this layer sparse."""
    if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
        from lantern.backends.mlx.moe import SparseMoE  # only MoE models pay its import

        return SparseMoE(cfg, softmax_after_topk=cfg.moe.softmax_after_topk)
    return MLP(cfg)
