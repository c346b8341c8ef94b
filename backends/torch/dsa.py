"""DeepSeek Sparse Attention (DeepSeek-V3.2) in torch: the lightning indexer and the rows it restricts.

The pool row of a DSA layer is [c_kv, k_pe, index key] (family_deepseek.MLAConfig.pool_dim); the latent
attention's query carries zeros against the index key, so the ordinary paged attention over the row is the
latent attention itself. A query that sees at most index_topk tokens attends to all of them -- exactly what the
indexer's top-k keeps -- so only rows past index_topk are computed again here, one sequence at a time: their
index scores against every earlier index key of the sequence (gathered from the pool), the top index_topk kept,
the latent attention over those alone (DeepseekV32Indexer / DeepseekV32Attention's maths, in float32). GLM-5's
"shared" layers run no indexer: they reuse the choice of the layer before that ran one (the step's cache holds it).
Index scores that tie exactly at the top-k boundary (several keys whose every head's relu is 0) are broken
however topk breaks them -- as in every implementation, the model does not define that order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import LayerNorm, apply_rotary

INDEX_NORM_EPS = 1e-6  # DeepseekV32Indexer's k_norm


class Indexer(nn.Module):
    def __init__(self, hidden: int, q_lora_rank: int, spec: Any):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = spec.n_heads, spec.head_dim, spec.topk
        self.interleaved = spec.interleaved  # GLM-5's rope turns pairs
        self.wq_b = nn.Linear(q_lora_rank, spec.n_heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(hidden, spec.head_dim, bias=False)
        self.k_norm = LayerNorm(spec.head_dim, INDEX_NORM_EPS)
        self.weights_proj = nn.Linear(hidden, spec.n_heads, bias=False)
        self.weights_proj.keep_float32 = True  # the loader places it in float32, as transformers keeps it

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[T, head_dim]: each token's index key, the rope (in halves) on its first cos.shape[-1] dims."""
        k = self.k_norm(self.wk(x))[0]
        return apply_rotary(k[:, None].contiguous(), cos, sin, self.interleaved)[:, 0]

    def scores(self, x: torch.Tensor, qr: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor):
        """[R, N] float32 index scores of R queries (their hidden states, query LoRA and rope rows) against N keys."""
        q = self.wq_b(qr).view(-1, self.n_heads, self.head_dim)
        q = apply_rotary(q.contiguous(), cos, sin, self.interleaved).float()
        # weights_proj held and applied in float32 (transformers keeps it so); both scales folded into the head weights
        weights = F.linear(x.float(), self.weights_proj.weight.float())
        weights = weights * (self.n_heads**-0.5 * self.head_dim**-0.5)
        per_head = torch.relu(torch.einsum("rhd,nd->rhn", q, keys.float()))
        return torch.einsum("rh,rhn->rn", weights, per_head)


def _sequences(meta: TorchAttentionMetadata, topk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(token rows, slots of positions 0..n-1) of each sequence holding a query past `topk` keys, built once
    per step (every DSA layer shares it)."""
    cached = meta.step_cache.get("dsa_sequences")
    if cached is not None:
        return cached
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    bs, dev = meta.block_size, meta.slot_mapping.device

    def slots(table: torch.Tensor, n: int) -> torch.Tensor:
        span = torch.arange(n, device=dev)
        return table.long()[span // bs] * bs + span % bs

    if meta.decode_token_idx is not None:
        for b, n in enumerate(meta.decode_seq_lens.tolist()):
            if n > topk:
                out.append((meta.decode_token_idx[b : b + 1], slots(meta.decode_block_tables[b], n)))
    for g in meta.prefills:
        if g.ctx_len > topk:  # (the chunk ends the context: its last query sees ctx_len keys)
            rows = torch.arange(g.q_start, g.q_end, device=dev)
            rows = rows[meta.positions[rows] >= topk]
            out.append((rows, slots(g.block_table, g.ctx_len)))
    meta.step_cache["dsa_sequences"] = out
    return out


# Rows recomputed at a time: bounds the [rows, heads, context] index and attention scores
_SCORE_BUDGET = 1 << 24  # float32 values


def restrict(
    out: torch.Tensor,
    query: torch.Tensor,
    x: torch.Tensor,
    qr: torch.Tensor,
    meta: TorchAttentionMetadata,
    layer: int,
    indexer: Indexer | None,
    topk: int,
    scale: float,
    latent_dim: int,
    v_dim: int,
) -> torch.Tensor:
    """`out` (the attention over every visible key) with the rows that see more than `topk` keys recomputed over
    the keys the indexer picks. query [T, H, pool width] (zeros past latent_dim), out [T, H, v_dim]. indexer None:
    a GLM-5 "shared" layer, which reads the choice of the last layer that ran one (kept in the step's cache)."""
    sequences = _sequences(meta, topk)
    if not sequences:
        return out
    pool = meta.pool.k[layer]
    chosen = meta.step_cache.setdefault("dsa_chosen", [None] * len(sequences))
    for i, (rows, slots) in enumerate(sequences):
        keys = pool[slots, 0]  # [N, pool width]: [c_kv, k_pe, index key]
        if indexer is not None:  # every row here sees more than topk keys: the top-k are all visible ones
            pos, n = meta.positions[rows], keys.shape[0]
            step = max(1, _SCORE_BUDGET // (indexer.n_heads * n))
            picks = []
            for r in range(0, len(rows), step):
                part = rows[r : r + step]
                score = indexer.scores(x[part], qr[part], meta.cos[part], meta.sin[part], keys[:, latent_dim:])
                future = torch.arange(n, device=pos.device)[None, :] > pos[r : r + step, None]
                picks.append(score.masked_fill(future, float("-inf")).topk(topk, dim=-1).indices)
            chosen[i] = torch.cat(picks)  # [R, topk]
        _latent_attention(out, query[:, :, :latent_dim], rows, keys[:, :latent_dim].float(), chosen[i], scale, v_dim)
    return out


def _latent_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    rows: torch.Tensor,
    latent: torch.Tensor,
    top: torch.Tensor,
    scale: float,
    v_dim: int,
) -> None:
    """out[rows] = each row's attention over its top-k keys (latent [N, L + R] float32, top [R, topk]). A decode row
    gathers its keys; a prefill chunk's rows share theirs, so one matmul over all N keys with the others masked (in
    blocks of _SCORE_BUDGET scores) beats a gather per row."""
    if len(rows) == 1:
        picked = latent[top]  # [1, topk, L + R]
        att = torch.einsum("rhw,rkw->rhk", query[rows].float(), picked) * scale
        out[rows] = torch.einsum("rhk,rkv->rhv", att.softmax(dim=-1), picked[..., :v_dim]).to(out.dtype)
        return
    n, heads = latent.shape[0], query.shape[1]
    step = max(1, _SCORE_BUDGET // (heads * n))
    for r in range(0, len(rows), step):
        part = rows[r : r + step]
        keep = torch.zeros(len(part), n, dtype=torch.bool, device=latent.device).scatter_(1, top[r : r + step], True)
        att = torch.einsum("rhw,nw->rhn", query[part].float(), latent) * scale
        att = att.masked_fill(~keep[:, None, :], float("-inf")).softmax(dim=-1)
        out[part] = torch.einsum("rhn,nv->rhv", att, latent[:, :v_dim]).to(out.dtype)
