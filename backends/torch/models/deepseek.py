"""DeepSeek V2 / V3 decoder in torch: multi-head latent attention over a latent KV pool, and
DeepSeek's routed + shared experts (the same layout as the MLX file; maths in
app/models/family_deepseek.py).

The pool keeps [c_kv, rotated k_pe] per token: one KV "head" of kv_lora_rank + qk_rope_head_dim
whose first kv_lora_rank columns are also the value (CausalLM.kv_layout). Attention runs in the
absorbed form for prefill and decode alike: q_nope is mapped into the latent space through
kv_b_proj's key rows, the attention output (a mix of latents) through its value rows. Scores are
then q_nope . (W_uk c) + q_pe . k_pe, what transformers computes after expanding K per head.
That form reads kv_b_proj's matrix, never the layer: a quantized kv_b_proj (--isq, an old
whole attn_kv_b GGUF) is made dense once after loading (CausalLM.finish_load).

Rope: the runner's tables have head_dim = qk_rope_head_dim (family_deepseek sets it). DeepSeek's
interleaved rope rotates pairs (x0, x1), (x2, x3), ...; taking the even then the odd columns turns
that into the rotate-half layout the tables and ops.rotary use (q and k alike, so scores match).

Routed experts reuse moe.SparseMoE's grouped expert computation (the loaders stack
`mlp.experts.E.{gate,up,down}_proj` into its StackedExperts); the router is DeepSeek's. Tensor
parallelism is not implemented for this family (refused at construction).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.base import KVLayout
from lantern.backends.torch import dsa
from lantern.backends.torch.attention import TorchAttentionMetadata, paged_attention
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.layers import MLP, RMSNorm, query_temperature
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE
from lantern.backends.torch.parallel import TPGroup


def _linear(d_in: int, d_out: int) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=False)


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        m = cfg.mla
        self.mla, self.layer_idx, self.n_heads = m, layer_idx, cfg.num_heads
        self.scale = cfg.attn_scale
        d, h = cfg.hidden_size, cfg.num_heads
        if m.q_lora_rank is None:
            self.q_proj = _linear(d, h * m.qk_head_dim)
        else:
            self.q_a_proj = _linear(d, m.q_lora_rank)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, m.norm_eps)
            if m.q_gate:  # (A.X-K2: [normed, raw] latent in; each head's query and output gate out)
                self.q_b_proj = _linear(2 * m.q_lora_rank, h * (m.qk_head_dim + m.v_head_dim))
            else:
                self.q_b_proj = _linear(m.q_lora_rank, h * m.qk_head_dim)
        self.kv_a_proj_with_mqa = _linear(d, m.kv_lora_rank + m.qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, m.norm_eps)
        self.kv_b_proj = _linear(m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim))
        self.o_proj = _linear(h * m.v_head_dim, d)
        if m.head_gate:  # (Ling 3.0: one output gate per head, from the layer's input)
            self.g_proj = _linear(d, h)
        self.temperature = cfg.attn_temperature  # Mistral 4: Llama 4's per-position query scale
        if m.indexer is not None and m.indexer.runs(layer_idx):  # DeepSeek Sparse Attention (dsa.py)
            self.indexer = dsa.Indexer(d, m.q_lora_rank, m.indexer)

    def dense_kv_b(self, dtype: torch.dtype) -> None:
        """Replace a quantized kv_b_proj by an nn.Linear holding its dequantized matrix in `dtype`
        (the model dtype), and drop the quantized layer.

        The absorbed attention multiplies by the matrix itself (per head, key and value rows
        apart), never by x through the layer, so the quantized form would only be a second copy.
        Done once after loading: the bytes counted then (which size the KV cache) are what the
        forward uses. The values are the quantized weight's own (QuantLayer.rows, decoded in
        float32) rounded once to the model dtype, as every float weight of the model is."""
        layer = self.kv_b_proj
        if isinstance(layer, nn.Linear):  # float checkpoint, or a joined attn_k_b / attn_v_b: as loaded
            return
        rows = getattr(layer, "rows", None)
        if rows is None:
            raise ValueError(f"layer {self.layer_idx}: kv_b_proj is a {type(layer).__name__}, not a quantized linear")
        device = next(layer.buffers()).device
        weight = rows(torch.arange(layer.out_features, device=device)).to(dtype)
        dense = nn.Linear(layer.in_features, layer.out_features, bias=False, device="meta")
        dense.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.kv_b_proj = dense

    def kv_b_weight(self) -> torch.Tensor:
        """[H, nope + v, kv_lora_rank]: each head's key rows, then its value rows."""
        m, layer = self.mla, self.kv_b_proj
        if not isinstance(layer, nn.Linear):  # a quantized layer's codes would be read as the matrix
            raise RuntimeError("kv_b_proj is still quantized: the loader calls CausalLM.finish_load")
        return layer.weight.view(self.n_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)

    def forward(self, x: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        m, t, h = self.mla, x.shape[0], self.n_heads
        gate = None
        if m.q_lora_rank is None:
            q = qr = self.q_proj(x)
        elif m.q_gate:
            qa = self.q_a_proj(x)
            qr = self.q_a_layernorm(qa)[0]
            q, gate = self.q_b_proj(torch.cat([qr, qa], dim=-1)).view(t, h, -1).split([m.qk_head_dim, m.v_head_dim], -1)
        else:
            qr = self.q_a_layernorm(self.q_a_proj(x))[0]
            q = self.q_b_proj(qr)
        if m.q_scale != 1.0:  # (LongCat-Flash)
            q = q * m.q_scale
        q_nope, q_pe = q.reshape(t, h, m.qk_head_dim).split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())[0]
        if m.kv_scale != 1.0:  # (LongCat-Flash: keys and values alike, both read the latent)
            latent = latent * m.kv_scale
        k_pe = k_pe.reshape(t, 1, m.qk_rope_head_dim)
        if m.rope_interleave:  # pairs (x0, x1), ... -> halves: evens then odds
            q_pe = torch.cat([q_pe[..., 0::2], q_pe[..., 1::2]], dim=-1)
            k_pe = torch.cat([k_pe[..., 0::2], k_pe[..., 1::2]], dim=-1)
        if m.rope:  # (Kimi Linear's are never rotated)
            q_pe = ops.rotary(q_pe.contiguous(), meta.cos, meta.sin)
            k_pe = ops.rotary(k_pe.contiguous(), meta.cos, meta.sin)
        w = self.kv_b_weight().to(x.dtype)
        w_uk, w_uv = w[:, : m.qk_nope_head_dim], w[:, m.qk_nope_head_dim :]  # [H, nope, L], [H, v, L]
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, L]
        query = torch.cat([q_latent, q_pe], dim=-1)
        if self.temperature is not None:  # every query column alike: the scores scale by it
            query = query * query_temperature(self.temperature, meta, query.dtype)
        key = torch.cat([latent, k_pe[:, 0]], dim=-1)  # [T, L + R]: what the pool keeps
        dsa_spec = m.indexer
        indexer = getattr(self, "indexer", None)
        if dsa_spec is not None:  # the index key beside it (zeros in a layer without an indexer); the query's
            index_key = indexer.keys(x, meta.cos, meta.sin) if indexer is not None else key.new_zeros(t, 1)
            key = torch.cat([key, index_key.to(key.dtype).expand(t, dsa_spec.head_dim)], dim=-1)
            query = torch.cat([query, query.new_zeros(t, h, dsa_spec.head_dim)], dim=-1)  # zeros leave scores be
        out = paged_attention(query, key[:, None], None, meta, self.layer_idx, self.scale)  # [T, H, L]
        if dsa_spec is not None:
            topk, lat = dsa_spec.topk, m.latent_dim
            out = dsa.restrict(out, query, x, qr, meta, self.layer_idx, indexer, topk, self.scale, lat, m.kv_lora_rank)
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        if gate is not None:  # (A.X-K2's output gate, in float32 as transformers computes it)
            out = (out * torch.sigmoid(gate.float())).to(out.dtype)
        if m.head_gate:  # (Ling 3.0: the sigmoid in float32, rounded to the model dtype, as transformers does)
            out = out * torch.sigmoid(self.g_proj(x).float()).to(out.dtype)[..., None]
        return self.o_proj(out.reshape(t, h * m.v_head_dim))


class Router(nn.Module):
    """DeepSeek's gate: weight [E, hidden]; V3 adds e_score_correction_bias [E] (choice only)."""

    def __init__(self, num_experts: int, hidden: int, bias: bool, keep_float32: bool = True):
        super().__init__()
        self.keep_float32 = keep_float32  # the loader places weight and bias in float32 (DeepSeekMoEConfig.router_fp32)
        self.weight = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)
        if bias:
            self.e_score_correction_bias = nn.Parameter(torch.empty(num_experts), requires_grad=False)


class DeepSeekMoE(SparseMoE):
    """Routed experts (SparseMoE's StackedExperts and grouped computation) + ungated shared experts."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, shared_experts: nn.Module | None = None):
        """shared_experts: the always-on MLP, when not DeepSeek's (a gated MLP of shared_size)."""
        super().__init__(cfg, tp)
        moe = cfg.moe
        self.moe = moe
        self.gate = Router(moe.num_experts, cfg.hidden_size, bias=moe.correction_bias, keep_float32=moe.router_fp32)
        if shared_experts is None and moe.shared_size:
            shared_experts = MLP(cfg, tp, moe.shared_size)
        self.shared_experts = shared_experts
        if moe.post_norm:  # (A.X-K1: the mixture's output normed)
            self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if moe.shared_mix:  # (Klear: the routed and shared outputs' weights, a softmax over two logits)
            self.coefficient = nn.Linear(cfg.hidden_size, 2, bias=True)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, k], float32 weights [T, k]) as transformers' DeepSeek routers pick them."""
        moe = self.moe
        logits = F.linear(x.float(), self.gate.weight.float())
        if moe.logit_softcap:  # (Laguna)
            logits = torch.tanh(logits / moe.logit_softcap) * moe.logit_softcap
        t, e, g = logits.shape[0], moe.num_experts, moe.n_group
        scores = logits.sigmoid() if moe.scoring == "sigmoid" else logits.softmax(dim=-1)
        if moe.topk_method == "noaux_tc":  # V3 and GLM (sigmoid, a bias for the choice); Mistral 4 (softmax)
            bias = getattr(self.gate, "e_score_correction_bias", None)
            choice = logits if moe.choose_on_logits else scores  # (Kolibri chooses by the logits)
            choice = choice if bias is None else choice + bias.float()
            group_scores = choice.view(t, g, e // g).topk(2, dim=-1).values.sum(dim=-1)
            choice = choice.masked_fill(~self._group_mask(group_scores, e), moe.group_fill)
            ids = choice.topk(moe.top_k, dim=-1).indices
            weights = scores.gather(1, ids)
            if moe.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + moe.norm_eps)
        else:  # V2
            if moe.topk_method == "group_limited_greedy":
                group_scores = scores.view(t, g, e // g).amax(dim=-1)
                scores = scores.masked_fill(~self._group_mask(group_scores, e), 0.0)
            weights, ids = scores.topk(moe.top_k, dim=-1)
            if moe.norm_topk_prob:  # (Hunyuan MoE; DeepSeek-V2's configs never ask: family_deepseek refuses it)
                weights = weights / (weights.sum(dim=-1, keepdim=True) + moe.norm_eps)
        return ids, weights * moe.routed_scaling_factor

    def _group_mask(self, group_scores: torch.Tensor, num_experts: int) -> torch.Tensor:
        """[T, E] bool: experts in each token's topk_group best groups."""
        t, g = group_scores.shape
        best = group_scores.topk(self.moe.topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        return mask[:, :, None].expand(t, g, num_experts // g).reshape(t, num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        if not self.moe.router_weights_fp32:  # ERNIE casts the weights to the model dtype first
            weights = weights.to(x.dtype)
        out = self.routed(x, ids, weights)  # float32 weights: each expert's share in float32
        if self.moe.shared_mix:
            mix = torch.softmax(self.coefficient(x).float(), dim=-1).to(x.dtype)
            return out * mix[:, :1] + self.shared_experts(x) * mix[:, 1:]
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
            if self.moe.shared_average:  # (Cohere2-MoE)
                out = out * 0.5
        if self.moe.post_norm:
            out = self.post_mlp_layernorm(out)[0]
        return out


class GatedRMSNorm(nn.Module):
    """A.X-K2's norm: y = RMSNorm(x), then y * sigmoid(W_up(silu(W_down(y)))) (the gate in float32), with RMSNorm's
    fused residual add."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.W_down = _linear(cfg.hidden_size, cfg.gated_norm_rank)
        self.W_up = _linear(cfg.gated_norm_rank, cfg.hidden_size)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        y, residual = self.norm(x, residual)
        return (y * torch.sigmoid(self.W_up(F.silu(self.W_down(y))).float())).to(y.dtype), residual


class DecoderLayer(llama.DecoderLayer):
    """Llama's layer over multi-head latent attention and DeepSeek's mixture."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        mlp = DeepSeekMoE(cfg, tp) if sparse else MLP(cfg, tp)
        super().__init__(cfg, layer_idx, tp, attn=MLAttention(cfg, layer_idx), mlp=mlp)
        if cfg.gated_norm_rank:  # (A.X-K2: the input norm gated, and a mixture layer's second norm)
            self.input_layernorm = GatedRMSNorm(cfg)
            if sparse:
                self.post_attention_layernorm = GatedRMSNorm(cfg)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        if tp.active:
            raise ValueError(
                "tensor parallelism is not implemented for multi-head latent attention (DeepSeek); "
                "serve this model with --tensor-parallel-size 1"
            )
        super().__init__(cfg, tp)

    def finish_load(self, dtype: torch.dtype) -> None:
        """After the weights are in (backends/torch/weights.py): each quantized kv_b_proj made
        dense once in `dtype` (MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            layer.self_attn.dense_kv_b(dtype)

    @staticmethod
    def kv_layout(cfg: ModelConfig) -> KVLayout:
        """One latent "head" per token: [c_kv, k_pe] (and DeepSeek-V3.2's index key); V is its first kv_lora_rank
        columns."""
        m = cfg.mla
        return KVLayout(1, m.pool_dim, m.kv_lora_rank, v_is_k_prefix=True)
