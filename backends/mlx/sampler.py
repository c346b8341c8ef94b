"""On-device sampling (MLX) for one step; semantics in backends/sampling_prep.py.

Logprobs are the model's raw log-probabilities (before temperature and penalties), as vLLM
reports them.
"""
from __future__ import annotations

import mlx.core as mx

from app.engine.batch import SamplingRow, StepOutput
from backends.sampling_prep import SamplingArrays, prepare_sampling, top_logprobs_lists

_MASK = -float("inf")


def _apply_penalties(logits: mx.array, a: SamplingArrays) -> mx.array:
    b, vocab = logits.shape
    counts = mx.zeros((b * vocab,), dtype=mx.float32)
    if a.output_flat.size:
        counts = counts.at[mx.array(a.output_flat)].add(1.0)
    counts = counts.reshape(b, vocab)
    seen = mx.zeros((b * vocab,), dtype=mx.bool_)
    if a.seen_flat.size:
        seen[mx.array(a.seen_flat)] = True
    seen = seen.reshape(b, vocab)
    rep = mx.array(a.repetition)
    # HF/vLLM repetition penalty: shrink positive logits, push negative ones further down.
    logits = mx.where(seen, mx.where(logits > 0, logits / rep, logits * rep), logits)
    # OpenAI frequency/presence penalties count generated tokens only.
    return logits - counts * mx.array(a.frequency) - (counts > 0) * mx.array(a.presence)


def _sample_random(logits: mx.array, a: SamplingArrays) -> mx.array:
    """Filtered Gumbel-max draw for a.random_rows; returns their token ids."""
    idx = a.random_rows
    rows = mx.array(idx)
    sub = logits[rows] / mx.array(a.temperature[idx])
    vocab = sub.shape[-1]
    order = mx.argsort(-sub, axis=-1)
    sorted_l = mx.take_along_axis(sub, order, axis=-1)
    ranks = mx.arange(vocab)[None, :]
    sorted_l = mx.where(ranks >= mx.array(a.top_k[idx]), _MASK, sorted_l)
    probs = mx.softmax(sorted_l, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
    drop_p = (mx.cumsum(probs, axis=-1) - probs) > mx.array(a.top_p[idx])
    drop_min = probs < mx.array(a.min_p[idx]) * probs[:, :1]
    sorted_l = mx.where(drop_p | drop_min, _MASK, sorted_l)
    noise = mx.stack([mx.random.gumbel((vocab,), key=mx.random.key(s)) for s in a.draw_seeds])
    choice = mx.argmax(sorted_l + noise, axis=-1)
    return mx.take_along_axis(order, choice[:, None], axis=-1)[:, 0]


def sample(logits: mx.array, rows: list[SamplingRow]) -> StepOutput:
    """logits [B, V] (one row per sampled sequence) -> chosen token ids (+ logprobs)."""
    logits = logits.astype(mx.float32)
    b, vocab = logits.shape
    a = prepare_sampling(rows, vocab)
    raw_logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if a.max_logprobs is not None else None
    if a.repetition is not None:
        logits = _apply_penalties(logits, a)
    if a.banned_flat is not None:
        flat = logits.reshape(-1)
        flat[mx.array(a.banned_flat)] = _MASK
        logits = flat.reshape(b, vocab)
    tokens = mx.argmax(logits, axis=-1)
    if a.random_rows:
        tokens[mx.array(a.random_rows)] = _sample_random(logits, a).astype(tokens.dtype)
    if raw_logprobs is None:
        mx.eval(tokens)
        return StepOutput(token_ids=tokens.tolist())
    k = a.max_logprobs
    chosen = mx.take_along_axis(raw_logprobs, tokens[:, None], axis=-1)[:, 0]
    ids = vals = None
    if k:
        top_ids = mx.argsort(-raw_logprobs, axis=-1)[:, :k]
        top_vals = mx.take_along_axis(raw_logprobs, top_ids, axis=-1)
        mx.eval(tokens, chosen, top_ids, top_vals)
        ids, vals = top_ids.tolist(), top_vals.tolist()
    mx.eval(tokens, chosen)
    return StepOutput(token_ids=tokens.tolist(), logprobs=chosen.tolist(),
                      top_logprobs=top_logprobs_lists(rows, ids, vals))
