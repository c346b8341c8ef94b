"""Building blocks the torch model files share: rope tables, RMSNorm, attention over the paged
pool, the gated MLP (same layout as the MLX blocks).

Rotary frequencies (default, linear, llama3, YaRN, LongRoPE) come from transformers' own rope
initialisers, so the scaling maths is the reference's, not a copy of it. q/k/v and gate/up are single stacked
projections (weights.py stacks them while loading).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.rope_config import longrope_factors
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, layer_pools, paged_attention
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.parallel import TPGroup
from lantern.backends.torch.quant_layer import QuantLayer

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu2": lambda x: F.relu(x).square(),  # Nemotron's
    "gelu": F.gelu,  # the exact (erf) GELU: GPT-NeoX, Falcon
    "relu": F.relu,  # OPT
}


def rotary_dim(cfg: ModelConfig) -> int:
    """Leading dims of each head the rope rotates: all of them unless the config's rope carries a
    partial_rotary_factor (GLM-4, Phi-4-mini: int(head_dim * factor), as transformers computes it)."""
    return int(cfg.head_dim * float((cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0)))


def rope_tables(
    cfg: ModelConfig, max_len: int, device: torch.device, theta: float | None = None, dim: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, rotary_dim(cfg)] (HF's rotate_half layout), attention scaling folded in.
    theta: a plain rope of this base instead of the config's (Gemma 3's sliding layers), turning `dim` dims of
    each head where given (Laguna's sliding layers turn all of them, its full layers half)."""
    if theta is not None:
        params = {"rope_theta": theta, "rope_type": "default"}
    else:
        scaled = {k: v for k, v in (cfg.rope_scaling or {}).items() if k != "served_context"}  # ours, not HF's
        params = {"rope_theta": cfg.rope_theta, "rope_type": "default", **scaled}
    rope_type = params["rope_type"]
    if rope_type == "default":
        base, dim = params["rope_theta"], dim or rotary_dim(cfg)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        scaling = 1.0
    else:  # transformers' config import costs ~3 s at start: only scaled ropes need it
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        hf_cfg = LlamaConfig(
            hidden_size=cfg.num_heads * cfg.head_dim,
            num_attention_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=params,  # with its partial_rotary_factor, which the initialisers read
        )
        seq_len = None  # LongRoPE: the initialiser takes the long factors for a sequence past the original length
        if rope_type == "longrope" and longrope_factors(cfg.rope_scaling, cfg.max_position_embeddings) == "long_factor":
            seq_len = params["original_max_position_embeddings"] + 1
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, torch.device("cpu"), seq_len=seq_len)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq.float())
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling).to(device), (emb.sin() * scaling).to(device)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False, step_cache: dict | None = None
) -> torch.Tensor:
    """Rope on the first cos.shape[-1] dims of each head of x [T, H, D]; the rest pass through.

    interleaved: rotate consecutive pairs (x0, x1), (x2, x3), ... (GLM-4) instead of the two
    halves (Llama, Phi-3). The pairs are gathered into halves, rotated by the same rotate_half
    kernel and scattered back, so one rope kernel and one table layout serve both.
    """
    rot = cos.shape[-1]
    if rot == x.shape[-1] and not interleaved:
        return ops.rotary(x, cos, sin, step_cache)
    part = x[..., :rot]
    if interleaved:  # (x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...)
        part = part.unflatten(-1, (rot // 2, 2)).transpose(-1, -2).flatten(-2)
    part = ops.rotary(part, cos, sin, step_cache)
    if interleaved:
        part = part.unflatten(-1, (2, rot // 2)).transpose(-1, -2).flatten(-2)
    return part if rot == x.shape[-1] else torch.cat([part, x[..., rot:]], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Norm of x (+ residual): (normed, new residual). One fused kernel on CUDA."""
        return ops.rms_norm(x, self.weight, self.eps, residual)


class LayerNorm(nn.Module):
    """nn.LayerNorm's maths (weight and bias) with layers.RMSNorm's fused residual add: (normed x + r, x + r).
    bias False: a weight only (MPT's)."""

    def __init__(self, dim: int, eps: float, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(dim), requires_grad=False) if bias else None
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x if residual is None else x + residual
        return F.layer_norm(h, (h.shape[-1],), self.weight, self.bias, self.eps), h


class Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        tp: TPGroup,
        norm: type[nn.Module] = RMSNorm,
        rope_interleaved: bool | None = None,
        o_bias: bool = False,
        sinks: bool = False,
        input_size: int | None = None,
    ):
        """rope_interleaved: the family rotates consecutive pairs (GLM-4), not halves (None: as the config
        says); the width rotated is the rope table's (rope_tables: rotary_dim(cfg)). o_bias: o_proj has a
        bias too; sinks: one learned sink logit per head (gpt-oss); input_size: the width of x where not
        hidden_size (Zamba2's shared blocks read [x, embedding])."""
        super().__init__()
        self.tp = tp
        self.rope_interleaved = cfg.rope_interleaved if rope_interleaved is None else rope_interleaved
        self.clip = cfg.clip_qkv
        self.layer_idx = layer_idx
        heads = cfg.layer_heads[layer_idx] if cfg.layer_heads else cfg.num_heads  # (Laguna's differ per layer)
        self.n_heads, self.n_kv, self.head_dim = heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim**-0.5
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None
        self.softcap = cfg.attn_softcap
        d, bias = cfg.hidden_size, cfg.attention_bias
        # (MiMo-V2-Flash's narrower values: padded to head_dim for the pool and attention, cut before o_proj)
        self.v_dim, self.v_scale = cfg.v_head_dim or self.head_dim, cfg.attn_value_scale
        self.splits = [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.v_dim]
        self.qkv_proj = nn.Linear(input_size or d, sum(self.splits), bias=bias)  # q, k, v stacked by weights.py
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, d, bias=o_bias)
        sinks = sinks or cfg.attn_sinks  # (gpt-oss passes it; Granite Swash's config says it)
        self.sinks = nn.Parameter(torch.empty(self.n_heads), requires_grad=False) if sinks else None
        self.gated = cfg.attn_output_gate  # the output times a gate of x before o_proj (AFMoE, Laguna, LFM3)
        if self.gated:
            width = self.n_heads if self.gated.endswith("_head") else self.n_heads * self.v_dim  # one per head
            self.gate_proj = nn.Linear(d, width, bias=False)
        self.qk_norm = cfg.qk_norm
        self.norm_after_rope = cfg.qk_norm_after_rope  # (Hunyuan)
        self.reversed = cfg.rope_reversed  # (NanoChat)
        if cfg.qk_norm:
            self.q_norm = norm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = norm(self.head_dim, cfg.rms_norm_eps)
        self.alibi_slopes = cfg.alibi_slopes  # BLOOM / MPT (a tensor of them made on first use, on q's device)
        self._alibi: torch.Tensor | None = None
        self.temperature = cfg.attn_temperature  # Ministral 3: queries scaled per position
        self.rotates = cfg.rope_layers is None or cfg.rope_layers[layer_idx]  # SmolLM3's NoPE layers do not
        self.sub_norm = cfg.sub_norms
        if cfg.sub_norms:  # BitNet: the output normed before o_proj
            self.attn_sub_norm = RMSNorm(self.n_heads * self.v_dim, cfg.rms_norm_eps)
        self._own_qkv = type(self).qkv is Attention.qkv  # (not a subclass's: see forward)

    def forward(
        self,
        x: torch.Tensor,
        meta: TorchAttentionMetadata,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_layer: int | None = None,
        qkv_delta: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """rope: this layer's (cos, sin) at each token's position; None: the model's (meta.cos/sin). kv_layer: the
        pool layer this call reads and writes where not its own (HRM-Text: each stack pass keeps its K/V).
        qkv_delta: (q, k, v) terms added to the projections (Zamba2's per-layer adapters on a shared block)."""
        t = x.shape[0]
        layer = self.layer_idx if kv_layer is None else kv_layer
        if self._own_qkv:  # (K and V may be written with the rope, in one kernel)
            q, k, v, written = self._project(x, meta, rope, qkv_delta, layer)
        else:  # a subclass reworks q, k or v after qkv(): attention writes what it returns
            (q, k, v), written = self.qkv(x, meta, rope, qkv_delta), False
        alibi = None
        if self.alibi_slopes is not None:
            if self._alibi is None or self._alibi.device != q.device:
                self._alibi = torch.tensor(self.alibi_slopes, dtype=torch.float32, device=q.device)
            alibi = self._alibi
        out = paged_attention(
            q,
            k,
            v,
            meta,
            layer,
            self.scale,
            window=self.window,
            softcap=self.softcap,
            sinks=self.sinks,
            write=not written,
            alibi=alibi,
        )
        if self.v_dim != self.head_dim:
            out = out[..., : self.v_dim]
        out = out.reshape(t, -1) if not self.gated else output_gate(self.gated, out, self.gate_proj(x))
        if self.sub_norm:
            out = self.attn_sub_norm(out)[0]
        return self.tp.all_reduce(self.o_proj(out))

    def qkv(
        self,
        x: torch.Tensor,
        meta: TorchAttentionMetadata,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        qkv_delta: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This step's q [T, H, D] and k / v [T, KVH, D] as attention reads them: projected, normed and rotated
        (rope / qkv_delta: as forward's)."""
        q, k, v, _ = self._project(x, meta, rope, qkv_delta)
        return q, k, v

    def _project(
        self,
        x: torch.Tensor,
        meta: TorchAttentionMetadata,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        qkv_delta: tuple[torch.Tensor, ...] | None,
        write_layer: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """qkv()'s (q, k, v), and whether k and v are in pool layer `write_layer` already: written by the rope's
        kernel where ops.rotary_write_kv takes them (CUDA, a plain rope over q's and k's heads)."""
        t = x.shape[0]
        written = False
        qkv = self.qkv_proj(x)
        if qkv_delta is not None:
            qkv = qkv + torch.cat(qkv_delta, dim=-1)
        if self.clip is not None:  # (OLMo 1)
            qkv = qkv.clamp(-self.clip, self.clip)
        q, k, v = qkv.split(self.splits, dim=-1)
        v = v.view(t, self.n_kv, self.v_dim)
        if self.v_scale != 1.0:
            v = v * self.v_scale
        if self.v_dim != self.head_dim:
            v = F.pad(v, (0, self.head_dim - self.v_dim))
        cos, sin = rope if rope is not None else (meta.cos, meta.sin)
        if self.reversed:  # (NanoChat) the other way round: sin negated, once per step
            sin = reversed_sin(sin, meta)
        if self.qk_norm and self.norm_after_rope:
            q, k = q.view(t, self.n_heads, self.head_dim), k.view(t, self.n_kv, self.head_dim)
            if self.rotates:
                q = apply_rotary(q, cos, sin, self.rope_interleaved, meta.rope_cache)
                k = apply_rotary(k, cos, sin, self.rope_interleaved, meta.rope_cache)
            q, k = self.q_norm(q.contiguous())[0], self.k_norm(k.contiguous())[0]
        elif self.qk_norm:
            q = self.q_norm(q.view(t, self.n_heads, self.head_dim))[0]
            k = self.k_norm(k.view(t, self.n_kv, self.head_dim))[0]
            if self.rotates:
                q = apply_rotary(q, cos, sin, self.rope_interleaved, meta.rope_cache)
                k = apply_rotary(k, cos, sin, self.rope_interleaved, meta.rope_cache)
        elif not self.rotates:
            q, k = q.view(t, self.n_heads, self.head_dim), k.view(t, self.n_kv, self.head_dim)
        else:  # q and k side by side in qkv: one rope call for both heads' sets
            qk = qkv[:, : self.splits[0] + self.splits[1]].view(t, self.n_heads + self.n_kv, self.head_dim)
            roped = None
            if write_layer is not None and not self.rope_interleaved and ops.use_triton(qk):
                pools = layer_pools(meta, write_layer)
                roped = ops.rotary_write_kv(qk, v, cos, sin, *pools, meta.slot_mapping)
            written = roped is not None
            qk = roped if written else apply_rotary(qk, cos, sin, self.rope_interleaved, meta.rope_cache)
            q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
        if self.temperature is not None:
            q = q * query_temperature(self.temperature, meta, q.dtype)
        return q, k, v, written


def reversed_sin(sin: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
    """-sin, made once per step and shared by every layer (the same tensor: ops.rotary's cache knows it)."""
    key = ("reversed_sin", id(sin))
    held = meta.step_cache.get(key)
    if held is None or held[0] is not sin:
        held = meta.step_cache[key] = (sin, -sin)
    return held[1]


def output_gate(kind: str, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Attention's output [T, H, D] times its gate, flattened to [T, H * D]: sigmoid per channel (AFMoE) or per head
    (LFM3, in the output's dtype as transformers computes it); softplus per channel or per head (Laguna, in float32
    as transformers computes it, then in the output's dtype)."""
    t = out.shape[0]
    if kind == "sigmoid":
        return out.reshape(t, -1) * torch.sigmoid(gate)
    if kind == "sigmoid_head":
        return (out * torch.sigmoid(gate)[..., None]).reshape(t, -1)
    g = F.softplus(gate.float()).to(out.dtype)
    return (out * g[..., None]).reshape(t, -1) if kind == "softplus_head" else out.reshape(t, -1) * g


def query_temperature(temp: Any, meta: TorchAttentionMetadata, dtype: torch.dtype) -> torch.Tensor:
    """Llama 4's query scale at each token's position, [T, 1, 1] in the queries' dtype: computed in
    float32 as transformers does (1 + beta * log(1 + floor((position + offset) / length))), then cast; made
    once per step and shared by every layer (temp: family_ministral.AttnTemperature)."""
    key = ("attn_temperature", dtype)
    scale = meta.step_cache.get(key)
    if scale is None:
        steps = torch.floor((meta.positions + temp.offset) / temp.length)
        scale = meta.step_cache[key] = (1 + temp.beta * torch.log(1 + steps)).to(dtype)[:, None, None]
    return scale


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, intermediate_size: int | None = None, bias: bool = False):
        """bias: the three projections have biases (RecurrentGemma's)."""
        super().__init__()
        self.tp = tp
        inner = intermediate_size or cfg.intermediate_size
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.silu = cfg.hidden_act == "silu"
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * inner, bias=bias)  # gate, up stacked
        self.down_proj = nn.Linear(inner, cfg.hidden_size, bias=bias)
        self.sub_norm = cfg.sub_norms
        if cfg.sub_norms:  # BitNet: the product normed before down_proj
            self.ffn_sub_norm = RMSNorm(inner, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        proj = self.gate_up_proj
        # A quantized gate_up may make SiLU(gate) * up in its own GEMV (a decode step on CUDA: one kernel for three).
        act = proj.silu_mul(x) if self.silu and isinstance(proj, QuantLayer) else None
        if act is None:
            gate_up = proj(x)
            act = ops.silu_mul(gate_up) if self.silu else None
            if act is None:
                gate, up = gate_up.chunk(2, dim=-1)
                act = self.act(gate).mul_(up)  # in place: one [T, inner] fewer
        if self.sub_norm:
            act = self.ffn_sub_norm(act)[0]
        return self.tp.all_reduce(self.down_proj(act))


def feed_forward(cfg: ModelConfig, layer_idx: int, tp: TPGroup) -> nn.Module:
    """The layer's MLP: a mixture of experts where the config makes this layer sparse."""
    if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
        from lantern.backends.torch.moe import SparseMoE  # only MoE models pay its import

        return SparseMoE(cfg, tp, softmax_after_topk=cfg.moe.softmax_after_topk)
    return MLP(cfg, tp)
