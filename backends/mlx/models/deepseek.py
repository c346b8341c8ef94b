"""DeepSeek V2 / V3 decoder for MLX: multi-head latent attention over a latent KV pool, and
DeepSeek's routed + shared experts (maths in app/models/family_deepseek.py; the torch file has the
same layout).

The pool keeps [c_kv, rotated k_pe] per token, one KV "head" whose first kv_lora_rank columns are
also the value (CausalLM.kv_layout). Attention runs in the absorbed form: q_nope goes into the
latent space through kv_b_proj's key rows, the attention output (a mix of latents) out through its
value rows (its matrix, never the layer: a quantized kv_b_proj is made dense once after loading,
CausalLM.finish_load). Rope rotates the qk_rope_head_dim part only, adjacent pairs (`traditional`) where
DeepSeek interleaves. Routed experts are moe.Experts (gather_mm / gather_qmm, stacked by the loader
from `mlp.experts.E.*`), chosen by DeepSeek's router.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.base import KVLayout
from lantern.backends.mlx import dsa
from lantern.backends.mlx.layers import MLP, query_temperature
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.moe import Experts
from lantern.backends.mlx.paged_attention import AttentionMetadata, paged_attention
from lantern.backends.mlx.quant import PermutedQuantizedLinear
from lantern.backends.mlx.rope import build_rope


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        m = cfg.mla
        self.mla, self.layer_idx, self.n_heads, self.scale = m, layer_idx, cfg.num_heads, cfg.attn_scale
        d, h = cfg.hidden_size, cfg.num_heads
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * m.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, m.q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(m.q_lora_rank, eps=m.norm_eps)
            if m.q_gate:  # (A.X-K2: [normed, raw] latent in; each head's query and output gate out)
                self.q_b_proj = nn.Linear(2 * m.q_lora_rank, h * (m.qk_head_dim + m.v_head_dim), bias=False)
            else:
                self.q_b_proj = nn.Linear(m.q_lora_rank, h * m.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(m.kv_lora_rank, eps=m.norm_eps)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * m.v_head_dim, d, bias=False)
        if m.head_gate:  # (Ling 3.0: one output gate per head, from the layer's input)
            self.g_proj = nn.Linear(d, h, bias=False)
        self.temperature = cfg.attn_temperature  # Mistral 4: Llama 4's per-position query scale
        self.rope = build_rope(
            m.qk_rope_head_dim, cfg.rope_theta, m.rope_interleave, cfg.rope_scaling, cfg.max_position_embeddings
        )
        if m.indexer is not None and m.indexer.runs(layer_idx):  # DeepSeek Sparse Attention (dsa.py)
            pairs, max_pos = m.indexer.interleaved, cfg.max_position_embeddings  # (V3.2's rope: halves; GLM-5's: pairs)
            rope = build_rope(m.qk_rope_head_dim, cfg.rope_theta, pairs, cfg.rope_scaling, max_pos)
            self.indexer = dsa.Indexer(d, m.q_lora_rank, m.indexer, rope)

    def dense_kv_b(self, dtype: mx.Dtype) -> None:
        """Replace a quantized kv_b_proj by an nn.Linear holding its dequantized matrix in `dtype`
        (the model dtype), and drop the quantized layer.

        The absorbed attention multiplies by the matrix itself (per head, key and value rows
        apart), never by x through the layer, so the quantized form would only be a second copy.
        Done once after loading: the bytes counted then (which size the KV cache) are what the
        forward uses. The values are the quantized arrays' own (mx.dequantize in float32) rounded
        once to the model dtype, as every float weight of the model is."""
        layer = self.kv_b_proj
        if not isinstance(layer, nn.QuantizedLinear):  # float checkpoint, or a joined attn_k_b / attn_v_b
            return
        mode = getattr(layer, "mode", "affine")
        # In float32 (scales and biases widened exactly first): mx.dequantize computes in the
        # scales' dtype, and Q8_0's float16 scales would round code * scale. (The microscaled
        # modes' uint8 scales are exponents / e4m3 codes: taken as they are.)
        biases = layer.get("biases")
        scales = layer.scales.astype(mx.float32) if mode == "affine" else layer.scales
        weight = mx.dequantize(
            layer.weight,
            scales,
            None if biases is None else biases.astype(mx.float32),
            group_size=layer.group_size,
            bits=layer.bits,
            mode=mode,
            dtype=mx.float32,
        )
        if "global_scale" in layer:  # NVFP4 with one float for the tensor (GlobalScaledQuantizedLinear)
            weight = weight * layer.global_scale
        weight = weight.astype(dtype)
        if isinstance(layer, PermutedQuantizedLinear):  # act-order: stored columns back in input order
            weight = layer.input_order(weight)
        mx.eval(weight)
        dense = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        dense.weight = weight
        self.kv_b_proj = dense

    def kv_b_weight(self) -> mx.array:
        """[H, nope + v, kv_lora_rank]: each head's key rows, then its value rows."""
        m, layer = self.mla, self.kv_b_proj
        if "scales" in layer:  # a quantized layer's packed codes would be read as the matrix
            raise RuntimeError("kv_b_proj is still quantized: the loader calls CausalLM.finish_load")
        return layer.weight.reshape(self.n_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)

    def _rotate(self, x: mx.array, positions: mx.array) -> mx.array:
        # Tokens as a batch of length-1 sequences: one rope offset per token.
        return self.rope(x[:, :, None, :], offset=positions)[:, :, 0, :]

    def __call__(self, x: mx.array, meta: AttentionMetadata) -> mx.array:
        m, t, h = self.mla, x.shape[0], self.n_heads
        gate = None
        if m.q_lora_rank is None:
            q = qr = self.q_proj(x)
        elif m.q_gate:
            qa = self.q_a_proj(x)
            qr = self.q_a_layernorm(qa)
            qg = self.q_b_proj(mx.concatenate([qr, qa], axis=-1)).reshape(t, h, -1)
            q, gate = qg[..., : m.qk_head_dim], qg[..., m.qk_head_dim :]
        else:
            qr = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(qr)
        if m.q_scale != 1.0:  # (LongCat-Flash)
            q = q * m.q_scale
        q = q.reshape(t, h, m.qk_head_dim)
        q_nope, q_pe = q[..., : m.qk_nope_head_dim], q[..., m.qk_nope_head_dim :]
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[:, : m.kv_lora_rank])
        if m.kv_scale != 1.0:  # (LongCat-Flash: keys and values alike, both read the latent)
            latent = latent * m.kv_scale
        k_pe = kv[:, None, m.kv_lora_rank :]  # [T, 1, R]
        if m.rope:  # (Kimi Linear's are never rotated)
            q_pe, k_pe = self._rotate(q_pe, meta.positions), self._rotate(k_pe, meta.positions)
        w = self.kv_b_weight().astype(x.dtype)
        w_uk, w_uv = w[:, : m.qk_nope_head_dim], w[:, m.qk_nope_head_dim :]  # [H, nope, L], [H, v, L]
        q_latent = (q_nope.transpose(1, 0, 2) @ w_uk).transpose(1, 0, 2)  # [T, H, L]
        query = mx.concatenate([q_latent, q_pe], axis=-1)
        if self.temperature is not None:  # Mistral 4: every query column alike, so the scores scale by it
            query = query * query_temperature(self.temperature, meta.positions, query.dtype)
        key = mx.concatenate([latent, k_pe[:, 0]], axis=-1)  # [T, L + R]: what the pool keeps
        dsa_spec = m.indexer
        indexer = self.get("indexer")
        if dsa_spec is not None:  # the index key beside it (zeros in a layer without an indexer); the query's
            width = (t, dsa_spec.head_dim)
            index_key = indexer.keys(x, meta.positions) if indexer is not None else mx.zeros(width, dtype=key.dtype)
            key = mx.concatenate([key, index_key.astype(key.dtype)], axis=-1)
            query = mx.concatenate([query, mx.zeros((t, h, dsa_spec.head_dim), dtype=query.dtype)], axis=-1)
        out = paged_attention(query, key[:, None], None, meta, self.layer_idx, self.scale)  # [T, H, L]
        if dsa_spec is not None:
            topk, lat = dsa_spec.topk, m.latent_dim
            out = dsa.restrict(out, query, x, qr, meta, self.layer_idx, indexer, topk, self.scale, lat, m.kv_lora_rank)
        out = (out.transpose(1, 0, 2) @ w_uv.swapaxes(1, 2)).transpose(1, 0, 2)  # [T, H, v]
        if gate is not None:  # (A.X-K2's output gate, in float32 as transformers computes it)
            out = (out * mx.sigmoid(gate.astype(mx.float32))).astype(out.dtype)
        if m.head_gate:  # (Ling 3.0: the sigmoid in float32, rounded to the model dtype, as transformers does)
            out = out * mx.sigmoid(self.g_proj(x).astype(mx.float32)).astype(out.dtype)[..., None]
        return self.o_proj(out.reshape(t, h * m.v_head_dim))


class Router(nn.Module):
    """DeepSeek's gate: weight [E, hidden]; V3 adds e_score_correction_bias [E] (choice only)."""

    def __init__(self, num_experts: int, hidden: int, bias: bool, keep_float32: bool = True):
        super().__init__()
        self.keep_float32 = keep_float32  # the loader keeps weight and bias in float32 (DeepSeekMoEConfig.router_fp32)
        self.weight = mx.zeros((num_experts, hidden))
        if bias:
            self.e_score_correction_bias = mx.zeros((num_experts,))


def _top_k(x: mx.array, k: int) -> mx.array:
    """Indices of the k largest entries of each row (in no particular order)."""
    return mx.argpartition(-x, kth=k - 1, axis=-1)[:, :k]


class DeepSeekMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, shared_experts: nn.Module | None = None):
        """shared_experts: the always-on MLP, when not DeepSeek's (a gated MLP of shared_size)."""
        super().__init__()
        moe = cfg.moe
        self.moe = moe
        self.gate = Router(moe.num_experts, cfg.hidden_size, bias=moe.correction_bias, keep_float32=moe.router_fp32)
        self.experts = Experts(cfg)
        if shared_experts is None and moe.shared_size:
            shared_experts = MLP(cfg, moe.shared_size)
        if shared_experts is not None:
            self.shared_experts = shared_experts
        if moe.post_norm:  # (A.X-K1: the mixture's output normed)
            self.post_mlp_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if moe.shared_mix:  # (Klear: the routed and shared outputs' weights, a softmax over two logits)
            self.coefficient = nn.Linear(cfg.hidden_size, 2, bias=True)

    def _group_mask(self, group_scores: mx.array, num_experts: int) -> mx.array:
        """[T, E] bool: experts in each token's topk_group best groups."""
        t, g = group_scores.shape
        best = _top_k(group_scores, self.moe.topk_group)
        mask = mx.put_along_axis(mx.zeros((t, g), dtype=mx.bool_), best, mx.array(True), axis=-1)
        return mx.broadcast_to(mask[:, :, None], (t, g, num_experts // g)).reshape(t, num_experts)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """(expert ids [T, k], float32 weights [T, k]) as transformers' DeepSeek routers pick them."""
        moe = self.moe
        logits = x.astype(mx.float32) @ self.gate.weight.astype(mx.float32).T
        if moe.logit_softcap:  # (Laguna)
            logits = mx.tanh(logits / moe.logit_softcap) * moe.logit_softcap
        t, e, g = logits.shape[0], moe.num_experts, moe.n_group
        scores = mx.sigmoid(logits) if moe.scoring == "sigmoid" else mx.softmax(logits, axis=-1, precise=True)
        if moe.topk_method == "noaux_tc":  # V3 and GLM (sigmoid, a bias for the choice); Mistral 4 (softmax)
            bias = self.gate.get("e_score_correction_bias")
            choice = logits if moe.choose_on_logits else scores  # (Kolibri chooses by the logits)
            choice = choice if bias is None else choice + bias.astype(mx.float32)
            group_scores = mx.sort(choice.reshape(t, g, e // g), axis=-1)[..., -2:].sum(axis=-1)
            choice = mx.where(self._group_mask(group_scores, e), choice, moe.group_fill)
            ids = _top_k(choice, moe.top_k)
            weights = mx.take_along_axis(scores, ids, axis=-1)
            if moe.norm_topk_prob:
                weights = weights / (weights.sum(axis=-1, keepdims=True) + moe.norm_eps)
        else:  # V2
            if moe.topk_method == "group_limited_greedy":
                group_scores = scores.reshape(t, g, e // g).max(axis=-1)
                scores = mx.where(self._group_mask(group_scores, e), scores, 0.0)
            ids = _top_k(scores, moe.top_k)
            weights = mx.take_along_axis(scores, ids, axis=-1)
            if moe.norm_topk_prob:  # (Hunyuan MoE; DeepSeek-V2's configs never ask: family_deepseek refuses it)
                weights = weights / (weights.sum(axis=-1, keepdims=True) + moe.norm_eps)
        return ids, weights * moe.routed_scaling_factor

    def __call__(self, x: mx.array) -> mx.array:
        ids, weights = self.route(x)
        if not self.moe.router_weights_fp32:  # ERNIE casts the weights to the model dtype first
            weights = weights.astype(x.dtype)
        y = self.experts(x, ids)  # [T, k, hidden]
        out = (y * weights[..., None]).astype(x.dtype).sum(axis=1)  # each expert's share in float32
        if self.moe.shared_mix:
            mix = mx.softmax(self.coefficient(x).astype(mx.float32), axis=-1, precise=True).astype(x.dtype)
            return out * mix[:, :1] + self.shared_experts(x) * mix[:, 1:]
        if "shared_experts" in self:
            out = out + self.shared_experts(x)
            if self.moe.shared_average:  # (Cohere2-MoE)
                out = out * 0.5
        if "post_mlp_layernorm" in self:
            out = self.post_mlp_layernorm(out)
        return out


class GatedRMSNorm(nn.Module):
    """A.X-K2's norm: y = RMSNorm(x), then y * sigmoid(W_up(silu(W_down(y)))) (the gate in float32)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.W_down = nn.Linear(cfg.hidden_size, cfg.gated_norm_rank, bias=False)
        self.W_up = nn.Linear(cfg.gated_norm_rank, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.norm(x)
        return (y * mx.sigmoid(self.W_up(nn.silu(self.W_down(y))).astype(mx.float32))).astype(y.dtype)


class DecoderLayer(llama.DecoderLayer):
    """Llama's layer over multi-head latent attention and DeepSeek's mixture."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        mlp = DeepSeekMoE(cfg) if sparse else MLP(cfg)
        super().__init__(cfg, layer_idx, attn=MLAttention(cfg, layer_idx), mlp=mlp)
        if cfg.gated_norm_rank:  # (A.X-K2: the input norm gated, and a mixture layer's second norm)
            self.input_layernorm = GatedRMSNorm(cfg)
            if sparse:
                self.post_attention_layernorm = GatedRMSNorm(cfg)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def finish_load(self, dtype: mx.Dtype) -> None:
        """After the weights are in (backends/mlx/weights.py): each quantized kv_b_proj made
        dense once in `dtype` (MLAttention.dense_kv_b)."""
        for layer in self.model.layers:
            layer.self_attn.dense_kv_b(dtype)

    @staticmethod
    def kv_layout(cfg: ModelConfig) -> KVLayout:
        """One latent "head" per token: [c_kv, k_pe] (and DeepSeek-V3.2's index key); V is its first kv_lora_rank
        columns."""
        m = cfg.mla
        return KVLayout(1, m.pool_dim, m.kv_lora_rank, v_is_k_prefix=True)
