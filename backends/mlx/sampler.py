"""On-device sampling for one step: penalties, temperature, top-k/top-p/min-p, seeded draws, logprobs.

Each row's draw depends only on its own logits and (seed, step), never on what else is in the
batch, so seeded requests reproduce alone or batched. Logprobs are the model's raw
log-probabilities (before temperature and penalties), as vLLM reports them.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from app.engine.batch import SamplingRow, StepOutput

_MASK = -float("inf")


def _draw_key(seed: int, step: int) -> mx.array:
    # A per-(seed, step) key: the same draw whatever the batch or the order of rows.
    return mx.random.key((seed * 1_000_003 + step) & 0xFFFFFFFFFFFF)


def _apply_penalties(logits: mx.array, rows: list[SamplingRow]) -> mx.array:
    b, vocab = logits.shape
    rep = np.ones((b, 1), np.float32)
    freq = np.zeros((b, 1), np.float32)
    pres = np.zeros((b, 1), np.float32)
    seen_rows, seen_ids, out_rows, out_ids = [], [], [], []
    for r, row in enumerate(rows):
        p = row.params
        if not p.uses_penalties:
            continue
        rep[r], freq[r], pres[r] = p.repetition_penalty, p.frequency_penalty, p.presence_penalty
        if p.repetition_penalty != 1.0:
            ids = set(row.prompt_token_ids) | set(row.output_token_ids)
            seen_rows += [r] * len(ids)
            seen_ids += list(ids)
        out_rows += [r] * len(row.output_token_ids)
        out_ids += row.output_token_ids
    counts = mx.zeros((b * vocab,), dtype=mx.float32)
    if out_ids:
        flat = mx.array(np.asarray(out_rows) * vocab + np.asarray(out_ids))
        counts = counts.at[flat].add(1.0)
    counts = counts.reshape(b, vocab)
    seen = mx.zeros((b * vocab,), dtype=mx.bool_)
    if seen_ids:
        seen[mx.array(np.asarray(seen_rows) * vocab + np.asarray(seen_ids))] = True
    seen = seen.reshape(b, vocab)
    rep_a = mx.array(rep)
    # HF/vLLM repetition penalty: shrink positive logits, push negative ones further down.
    logits = mx.where(seen, mx.where(logits > 0, logits / rep_a, logits * rep_a), logits)
    # OpenAI frequency/presence penalties count generated tokens only.
    return logits - counts * mx.array(freq) - (counts > 0) * mx.array(pres)


def _ban(logits: mx.array, rows: list[SamplingRow]) -> mx.array:
    rr, ids = [], []
    for r, row in enumerate(rows):
        rr += [r] * len(row.banned_token_ids)
        ids += row.banned_token_ids
    if not ids:
        return logits
    b, vocab = logits.shape
    ids_np = np.asarray(ids)
    keep = ids_np < vocab
    flat = logits.reshape(-1)
    flat[mx.array(np.asarray(rr)[keep] * vocab + ids_np[keep])] = _MASK
    return flat.reshape(b, vocab)


def _sample_random(logits: mx.array, rows: list[SamplingRow], idx: list[int]) -> mx.array:
    """Filtered Gumbel-max draw for the rows in idx; returns token ids [len(idx)]."""
    sub = logits[mx.array(idx)] if len(idx) != logits.shape[0] else logits
    vocab = sub.shape[-1]
    temp = mx.array([[rows[i].params.temperature] for i in idx], dtype=mx.float32)
    top_k = np.array([[rows[i].params.top_k or vocab] for i in idx])
    top_p = mx.array([[rows[i].params.top_p] for i in idx], dtype=mx.float32)
    min_p = mx.array([[rows[i].params.min_p] for i in idx], dtype=mx.float32)
    sub = sub / temp
    order = mx.argsort(-sub, axis=-1)
    sorted_l = mx.take_along_axis(sub, order, axis=-1)
    ranks = mx.arange(vocab)[None, :]
    sorted_l = mx.where(ranks >= mx.array(top_k), _MASK, sorted_l)
    probs = mx.softmax(sorted_l, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
    drop_p = (mx.cumsum(probs, axis=-1) - probs) > top_p
    drop_min = probs < min_p * probs[:, :1]
    sorted_l = mx.where(drop_p | drop_min, _MASK, sorted_l)
    noise = mx.stack([mx.random.gumbel((vocab,), key=_draw_key(rows[i].seed, rows[i].step)) for i in idx])
    choice = mx.argmax(sorted_l + noise, axis=-1)
    return mx.take_along_axis(order, choice[:, None], axis=-1)[:, 0]


def sample(logits: mx.array, rows: list[SamplingRow]) -> StepOutput:
    """logits [B, V] (one row per sampled sequence) -> chosen token ids (+ logprobs)."""
    logits = logits.astype(mx.float32)
    want_logprobs = any(r.params.logprobs is not None for r in rows)
    raw_logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if want_logprobs else None
    if any(r.params.uses_penalties for r in rows):
        logits = _apply_penalties(logits, rows)
    logits = _ban(logits, rows)
    greedy = mx.argmax(logits, axis=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.params.greedy]
    if random_idx:
        drawn = _sample_random(logits, rows, random_idx)
        is_random = np.zeros(len(rows), dtype=bool)
        is_random[random_idx] = True
        pos = np.cumsum(is_random) - 1
        tokens = mx.where(mx.array(is_random), drawn[mx.array(np.maximum(pos, 0))], greedy)
    else:
        tokens = greedy
    if not want_logprobs:
        mx.eval(tokens)
        return StepOutput(token_ids=tokens.tolist())
    k = max(r.params.logprobs or 0 for r in rows)
    chosen = mx.take_along_axis(raw_logprobs, tokens[:, None], axis=-1)[:, 0]
    top_ids = mx.argsort(-raw_logprobs, axis=-1)[:, :k] if k else None
    top_vals = mx.take_along_axis(raw_logprobs, top_ids, axis=-1) if k else None
    mx.eval(tokens, chosen, *( [top_ids, top_vals] if k else []))
    top: list[list[tuple[int, float]]] = []
    ids_l = top_ids.tolist() if k else None
    vals_l = top_vals.tolist() if k else None
    for r, row in enumerate(rows):
        n = row.params.logprobs or 0
        top.append(list(zip(ids_l[r][:n], vals_l[r][:n])) if n else [])
    return StepOutput(token_ids=tokens.tolist(), logprobs=chosen.tolist(), top_logprobs=top)
