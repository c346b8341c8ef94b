"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) in MLX: the lightning indexer and the rows it restricts -- the
torch file's maths and layout (backends/torch/dsa.py says how: the index key in the latent pool row, rows past
index_topk recomputed over the keys the indexer picks, GLM-5's shared layers reading the choice before)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from lantern.backends.mlx.paged_attention import AttentionMetadata

INDEX_NORM_EPS = 1e-6  # DeepseekV32Indexer's k_norm


class Indexer(nn.Module):
    def __init__(self, hidden: int, q_lora_rank: int, spec: Any, rope: Any):
        """rope: the indexer's rope over qk_rope_head_dim (in halves, GLM-5's in pairs)."""
        super().__init__()
        self.n_heads, self.head_dim, self.topk = spec.n_heads, spec.head_dim, spec.topk
        self.wq_b = nn.Linear(q_lora_rank, spec.n_heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(hidden, spec.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(spec.head_dim, eps=INDEX_NORM_EPS)
        self.weights_proj = nn.Linear(hidden, spec.n_heads, bias=False)
        self._rope = rope  # (a leading _: not a parameter)

    def _rotate(self, x: mx.array, positions: mx.array) -> mx.array:
        return self._rope(x[:, :, None, :], offset=positions)[:, :, 0, :]

    def keys(self, x: mx.array, positions: mx.array) -> mx.array:
        """[T, head_dim]: each token's index key, the rope on its first qk_rope_head_dim dims."""
        return self._rotate(self.k_norm(self.wk(x))[:, None], positions)[:, 0]

    def scores(self, x: mx.array, qr: mx.array, positions: mx.array, keys: mx.array) -> mx.array:
        """[R, N] float32 index scores of R queries (hidden states, query LoRA, positions) against N keys."""
        q = self._rotate(self.wq_b(qr).reshape(-1, self.n_heads, self.head_dim), positions).astype(mx.float32)
        # weights_proj in float32 (transformers keeps it so); both scales folded into the head weights
        weights = x.astype(mx.float32) @ self.weights_proj.weight.astype(mx.float32).T
        weights = weights * (self.n_heads**-0.5 * self.head_dim**-0.5)
        per_head = mx.maximum(q @ keys.astype(mx.float32).T, 0.0)  # [R, H, N]
        return (weights[:, :, None] * per_head).sum(axis=1)


def _sequences(meta: AttentionMetadata, topk: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(token rows, their positions, slots of positions 0..n-1) of each sequence holding a query past `topk`
    keys, built once per step (every DSA layer shares it)."""
    cached = meta.step_cache.get("dsa_sequences")
    if cached is not None:
        return cached
    out = []
    bs = meta.block_size
    if meta.decode_token_idx is not None:
        rows = np.array(meta.decode_token_idx)
        for b, n in enumerate(meta.decode_seq_lens_np.tolist()):
            if n > topk:
                span = np.arange(n)
                slots = meta.decode_tables_np[b][span // bs].astype(np.int64) * bs + span % bs
                out.append((rows[b : b + 1], np.array([n - 1]), slots))
    for g in meta.prefills:
        positions = g.first_pos + np.arange(g.q_end - g.q_start)
        if positions[-1] < topk:
            continue
        if g.slots_np is not None:
            slots = g.slots_np.astype(np.int64)
        else:  # no cached prefix: the chunk (from position 0) is the whole context
            slots = np.array(meta.slot_mapping[g.q_start : g.q_end]).astype(np.int64)
        keep = positions >= topk
        out.append((np.arange(g.q_start, g.q_end)[keep], positions[keep], slots))
    meta.step_cache["dsa_sequences"] = out
    return out


# Rows recomputed at a time: bounds the [rows, heads, context] index and attention scores
_SCORE_BUDGET = 1 << 24  # float32 values


def restrict(
    out: mx.array,
    query: mx.array,
    x: mx.array,
    qr: mx.array,
    meta: AttentionMetadata,
    layer: int,
    indexer: Indexer | None,
    topk: int,
    scale: float,
    latent_dim: int,
    v_dim: int,
) -> mx.array:
    """`out` (the attention over every visible key) with the rows that see more than `topk` keys recomputed over
    the keys the indexer picks. query [T, H, pool width] (zeros past latent_dim), out [T, H, v_dim]. indexer None:
    a GLM-5 "shared" layer, which reads the choice of the last layer that ran one (kept in the step's cache)."""
    sequences = _sequences(meta, topk)
    if not sequences:
        return out
    pool = meta.pool.k[layer]
    chosen = meta.step_cache.setdefault("dsa_chosen", [None] * len(sequences))
    for i, (rows_np, pos_np, slots_np) in enumerate(sequences):
        keys = pool[mx.array(slots_np)][:, 0]  # [N, pool width]: [c_kv, k_pe, index key]
        if indexer is not None:  # every row here sees more than topk keys: the top-k are all visible ones
            n = keys.shape[0]
            step = max(1, _SCORE_BUDGET // (indexer.n_heads * n))
            picks = []
            for r in range(0, len(rows_np), step):
                part, pos = mx.array(rows_np[r : r + step]), pos_np[r : r + step]
                score = indexer.scores(x[part], qr[part], mx.array(pos), keys[:, latent_dim:])
                score = mx.where(mx.array(np.arange(n)[None, :] > pos[:, None]), -mx.inf, score)
                picks.append(mx.argpartition(-score, kth=topk - 1, axis=-1)[:, :topk])
            chosen[i] = mx.concatenate(picks)  # [R, topk]
        latent = keys[:, :latent_dim].astype(mx.float32)
        out = _latent_attention(out, query[:, :, :latent_dim], rows_np, latent, chosen[i], scale, v_dim)
    return out


def _latent_attention(
    out: mx.array, query: mx.array, rows_np: np.ndarray, latent: mx.array, top: mx.array, scale: float, v_dim: int
) -> mx.array:
    """out with out[rows] = each row's attention over its top-k keys (the torch file's _latent_attention: a decode
    row gathers its keys, a prefill chunk's rows take one matmul over all keys with the others masked, in blocks)."""
    if len(rows_np) == 1:
        rows = mx.array(rows_np)
        picked = latent[top]  # [1, topk, L + R]
        att = (query[rows].astype(mx.float32) @ picked.swapaxes(1, 2)) * scale  # [1, H, topk]
        out[rows] = (mx.softmax(att, axis=-1, precise=True) @ picked[..., :v_dim]).astype(out.dtype)
        return out
    n, heads = latent.shape[0], query.shape[1]
    step = max(1, _SCORE_BUDGET // (heads * n))
    for r in range(0, len(rows_np), step):
        part, idx = mx.array(rows_np[r : r + step]), top[r : r + step]
        keep = mx.put_along_axis(mx.zeros((idx.shape[0], n), dtype=mx.bool_), idx, mx.array(True), axis=-1)
        att = (query[part].astype(mx.float32) @ latent.T) * scale  # [R, H, N]
        att = mx.softmax(mx.where(keep[:, None, :], att, -mx.inf), axis=-1, precise=True)
        out[part] = (att @ latent[:, :v_dim]).astype(out.dtype)
    return out
