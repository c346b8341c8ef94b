"""Gemma 4 (text) decoder in torch over a flattened token batch (maths in app/models/family_gemma4.py;
the same layout as the MLX file): layers of two shapes over a KV pool whose layers differ in shape,
K/V shared by the last layers, per-layer embeddings, and the 26B-A4B's experts beside the dense MLP.

A KV-sharing layer reads the pool layer of its source (kv_sources) and this step's K/V that layer
computed (handed on per layer type through the forward pass), and writes nothing. The sliding layers
rotate with the runner's table (meta.cos / sin: ModelConfig's head_dim and rope_theta are theirs);
the full layers with their own proportional rope, computed from each step's positions.
"""

from __future__ import annotations

import torch
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.layers import ACTIVATIONS, MLP, apply_rotary
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE
from lantern.backends.torch.parallel import TPGroup, parallel_embed

Rope = tuple[torch.Tensor, torch.Tensor]
SharedKV = dict[str, tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(nn.Module):
    """x / rms(x) times the weight (none: scale-free), in float32, then x's dtype (Gemma4RMSNorm)."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False) if scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None and ops.use_triton(x):
            return ops.rms_norm(x, self.weight.float(), self.eps, None)[0]
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed if self.weight is None else normed * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        g4 = cfg.gemma4
        self.sliding = g4.is_sliding(layer_idx)
        self.layer_type = g4.layer_types[layer_idx]
        self.kv_index, self.writes = g4.kv_sources[layer_idx], g4.writes_kv(layer_idx)
        self.window = cfg.layer_windows[layer_idx] if cfg.layer_windows else None
        d, eps, heads = cfg.hidden_size, cfg.rms_norm_eps, cfg.num_heads
        self.n_heads = heads
        self.head_dim = hd = cfg.head_dim if self.sliding else g4.global_head_dim
        self.n_kv = cfg.num_kv_heads if self.sliding else g4.global_kv_heads
        self.o_proj = nn.Linear(heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, eps)
        self.splits = [heads * hd, self.n_kv * hd, self.n_kv * hd]
        self.fused = self.writes and (self.sliding or not g4.k_eq_v)
        if self.fused:  # q, k, v stacked by weights.py
            self.qkv_proj = nn.Linear(d, sum(self.splits), bias=False)
        else:  # V is K's projection (full layers of k_eq_v models), or no K/V at all (a sharing layer)
            self.q_proj = nn.Linear(d, heads * hd, bias=False)
            if self.writes:
                self.k_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        if self.writes:
            self.k_norm = RMSNorm(hd, eps)
            self.v_norm = RMSNorm(hd, eps, scale=False)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata, rope: Rope, shared: SharedKV) -> torch.Tensor:
        t, hd = x.shape[0], self.head_dim
        cos, sin = rope
        if self.fused:
            q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        else:
            q = self.q_proj(x)
            k = v = self.k_proj(x) if self.writes else None
        q = apply_rotary(self.q_norm(q.reshape(t, self.n_heads, hd)), cos, sin, False, meta.rope_cache)
        if self.writes:
            k = apply_rotary(self.k_norm(k.reshape(t, self.n_kv, hd)), cos, sin, False, meta.rope_cache)
            v = self.v_norm(v.reshape(t, self.n_kv, hd))
            shared[self.layer_type] = (k, v)
        else:
            k, v = shared[self.layer_type]
        out = paged_attention(q, k, v, meta, self.kv_index, 1.0, window=self.window, write=self.writes)
        return self.o_proj(out.reshape(t, -1))


class MLPWithExperts(SparseMoE):
    """The dense MLP (forward) with the routed experts beside it (routed_beside): their parameters under
    the same `mlp`, as family_gemma4.checkpoint_name names them (the router's projection is `gate`)."""

    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__(cfg)
        d = cfg.hidden_size
        self.gate_up_proj = nn.Linear(d, 2 * width, bias=False)  # gate, up stacked
        self.down_proj = nn.Linear(width, d, bias=False)
        self.router_scale = nn.Parameter(torch.ones(d), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(self.num_experts), requires_grad=False)
        self.router_norm = RMSNorm(d, cfg.rms_norm_eps, scale=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate).mul_(up))

    def route(self, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.router_norm(residual) * self.router_scale * (residual.shape[-1] ** -0.5)
        probs = torch.softmax(self.gate(h), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights * self.per_expert_scale[ids].float()

    def routed_beside(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The experts' output for x, chosen by the router from the residual stream."""
        ids, weights = self.route(residual)
        return self.routed(x, ids, weights)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        g4, d, eps = cfg.gemma4, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer_idx)
        self.sliding = self.self_attn.sliding
        self.moe = cfg.moe is not None
        width = g4.mlp_widths[layer_idx]
        self.mlp = MLPWithExperts(cfg, width) if self.moe else MLP(cfg, tp, width)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.post_feedforward_layernorm = RMSNorm(d, eps)
        if self.moe:
            self.post_feedforward_layernorm_1 = RMSNorm(d, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(d, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(d, eps)
        self.act = ACTIVATIONS[cfg.hidden_act]
        if g4.ple_dim:
            self.per_layer_input_gate = nn.Linear(d, g4.ple_dim, bias=False)
            self.per_layer_projection = nn.Linear(g4.ple_dim, d, bias=False)
            self.post_per_layer_input_norm = RMSNorm(d, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(
        self,
        x: torch.Tensor,
        meta: TorchAttentionMetadata,
        ropes: tuple[Rope, Rope],
        shared: SharedKV,
        ple: torch.Tensor | None,
    ) -> torch.Tensor:
        rope = ropes[0] if self.sliding else ropes[1]
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), meta, rope, shared))
        ffn = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe:
            routed = self.mlp.routed_beside(self.pre_feedforward_layernorm_2(h), h)
            ffn = self.post_feedforward_layernorm_1(ffn) + self.post_feedforward_layernorm_2(routed)
        h = h + self.post_feedforward_layernorm(ffn)
        if ple is not None:
            gated = self.act(self.per_layer_input_gate(h)) * ple
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return h * self.layer_scalar.to(h.dtype)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = RMSNorm

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        g4 = cfg.gemma4
        if g4.ple_dim:
            width = cfg.num_layers * g4.ple_dim
            m = self.model
            m.embed_tokens_per_layer = nn.Embedding(g4.ple_vocab, width, _weight=torch.empty(g4.ple_vocab, width))
            m.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            m.per_layer_projection_norm = RMSNorm(g4.ple_dim, cfg.rms_norm_eps)
        self._global_inv_freq: torch.Tensor | None = None  # on the weights' device, from the first step

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        h = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        h = h * llama.rounded(self.cfg.hidden_size**0.5, h.dtype)
        ple = self._per_layer_inputs(input_ids, h)
        ropes = ((meta.cos, meta.sin), self._global_rope(meta))
        shared: SharedKV = {}
        for i, layer in enumerate(self.model.layers):
            h = layer(h, meta, ropes, shared, None if ple is None else ple[:, i])
        return self.model.norm(h[rows])

    def _per_layer_inputs(self, input_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """[T, layers, ple]: the token's own per-layer embedding plus a projection of its embedding."""
        g4, m = self.cfg.gemma4, self.model
        if not g4.ple_dim:
            return None
        shape = (h.shape[0], self.cfg.num_layers, g4.ple_dim)
        table = m.embed_tokens_per_layer
        input_ids = torch.where(input_ids < g4.ple_vocab, input_ids, 0)  # ids past its table (3n's media) read row 0
        own = table(input_ids) if not isinstance(table, nn.Embedding) else table.weight[input_ids]
        own = own.reshape(shape) * llama.rounded(g4.ple_dim**0.5, own.dtype)
        proj = m.per_layer_model_projection(h) * (self.cfg.hidden_size**-0.5)
        proj = m.per_layer_projection_norm(proj.reshape(shape))
        return (proj + own.to(proj.dtype)) * (2.0**-0.5)

    def _global_rope(self, meta: TorchAttentionMetadata) -> Rope:
        """(cos, sin) of the full layers at each token's position: the proportional rope over the whole head,
        computed per step from the positions (a table for a 262144-token context would take 1 GiB)."""
        device = meta.cos.device
        if self._global_inv_freq is None or self._global_inv_freq.device != device:
            # Made outside CUDA-graph capture: the graph runner's warm-up steps come first.
            self._global_inv_freq = torch.from_numpy(self.cfg.gemma4.global_inv_freq()).to(device)
        freqs = meta.positions.float()[:, None] * self._global_inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(meta.cos.dtype), emb.sin().to(meta.sin.dtype)
