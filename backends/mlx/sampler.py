"""On-device sampling (MLX) for one step; semantics and the noise function in backends/sampling_prep.py.

Logprobs are the model's raw log-probabilities (before logit_bias, penalties and temperature), as
vLLM reports them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from lantern.app.engine.contract import PromptLogprobs, PromptRows, SamplingRow, StepOutput
from lantern.backends.sampling_prep import (
    MIX_C1,
    MIX_C2,
    SamplingArrays,
    mask_bytes,
    prepare_sampling,
    prompt_logprob_lists,
    top_logprobs_lists,
)

_MASK = -float("inf")
_C1 = mx.array(MIX_C1, dtype=mx.uint32)
_C2 = mx.array(MIX_C2, dtype=mx.uint32)


def mix32(x: mx.array) -> mx.array:
    """lowbias32 on uint32 (products wrap mod 2^32, as in the numpy reference)."""
    x = x ^ (x >> 16)
    x = x * _C1
    x = x ^ (x >> 15)
    x = x * _C2
    return x ^ (x >> 15)


@lru_cache(maxsize=8)
def column_hashes(vocab: int) -> mx.array:
    """mix32(column) for every column: the key-independent half of the hash, made once."""
    h = mix32(mx.arange(vocab, dtype=mx.uint32))
    mx.eval(h)
    return h


def noise_bits(keys: mx.array, col_hashes: mx.array) -> mx.array:
    """keys [R, 1] uint32, col_hashes [R, C] or [C] = mix32(columns) -> uint32 [R, C]."""
    return mix32(col_hashes ^ keys)


def gumbel_noise(keys: mx.array, col_hashes: mx.array) -> mx.array:
    """Gumbel(0, 1) noise, float32 [R, C], a pure function of (key, column)."""
    u = ((noise_bits(keys, col_hashes) >> 9).astype(mx.float32) + 0.5) * (2.0**-23)
    return -mx.log(-mx.log(u))


def _list(x: mx.array) -> Any:
    return x.tolist()  # typed as a scalar-or-list union by MLX's stubs


def _keys(a: SamplingArrays, rows: list[int] | None = None) -> mx.array:
    k = a.draw_keys if rows is None else a.draw_keys[rows]
    return mx.array(k.astype(np.uint32))


def _edit_logits(logits: mx.array, a: SamplingArrays) -> mx.array:
    """logit_bias, penalties and bans as sparse edits of the flat [B * vocab] view."""
    b, vocab = logits.shape
    flat = logits.reshape(-1)
    if a.bias_flat is not None and a.bias_values is not None:
        flat = flat.at[mx.array(a.bias_flat)].add(mx.array(a.bias_values))
    if a.rep_flat is not None and a.rep_values is not None:
        # HF/vLLM repetition penalty: shrink positive logits, push negative ones further down.
        idx, rep = mx.array(a.rep_flat), mx.array(a.rep_values)
        v = flat[idx]
        flat[idx] = mx.where(v > 0, v / rep, v * rep)
    if a.freq_flat is not None and a.freq_values is not None:
        # OpenAI frequency/presence penalties count generated tokens only.
        flat = flat.at[mx.array(a.freq_flat)].subtract(mx.array(a.freq_values))
    if a.banned_flat is not None:
        flat[mx.array(a.banned_flat)] = _MASK
    logits = flat.reshape(b, vocab)
    if a.mask_rows is not None and a.token_mask is not None:
        # x + 0 = x exactly and x + -inf = -inf: one add applies the mask.
        add = token_mask_addend(mx.array(mask_bytes(a.token_mask)), vocab)
        if len(a.mask_rows) == b:
            logits = logits + add
        else:
            rows = mx.array(a.mask_rows)
            logits[rows] = logits[rows] + add
    return logits


@lru_cache(maxsize=1)
def _byte_table() -> mx.array:
    """[256, 8] float32: 0 where bit j of byte b is set, else -inf."""
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return mx.array(np.where(bits == 1, 0.0, _MASK).astype(np.float32))


def token_mask_addend(mask_u8: mx.array, vocab: int) -> mx.array:
    """Packed mask bytes [R, 4W] (mask_bytes) -> float32 [R, vocab]: 0 on allowed tokens, -inf on the
    rest, and on columns past the mask."""
    add = _byte_table()[mask_u8].reshape(mask_u8.shape[0], -1)
    if add.shape[1] < vocab:
        add = mx.pad(add, [(0, 0), (0, vocab - add.shape[1])], constant_values=_MASK)
    return add[:, :vocab]


def _sample_random(sub: mx.array, a: SamplingArrays) -> mx.array:
    """Filtered Gumbel-max draw for the rows of `sub` (= logits[a.random_rows]); their token ids."""
    idx = a.random_rows
    temps = mx.array(a.temperature[idx])
    vocab = sub.shape[-1]
    hashes = column_hashes(vocab)
    # argmax(logits + T * gumbel) = argmax(logits / T + gumbel), without a division pass.
    if not a.filter_rows:
        return mx.argmax(sub + temps * gumbel_noise(_keys(a), hashes), axis=-1)
    tokens = mx.zeros((len(idx),), dtype=mx.uint32)
    plain = sorted(set(range(len(idx))) - set(a.filter_rows))
    if plain:
        pl = mx.array(plain)
        tokens[pl] = mx.argmax(sub[pl] + temps[pl] * gumbel_noise(_keys(a, plain), hashes), axis=-1)
    # Rows with top-k/top-p/min-p: rank their best columns, mask, and draw among the survivors
    # with the same per-column noise (so the filter decides only which columns may win).
    f = a.filter_rows
    fcol = lambda x: mx.array(x[idx][f])
    fsub = sub[mx.array(f)] / temps[mx.array(f)]  # top-p and min-p act on the probabilities at T
    width = a.filter_width
    if width < vocab:
        best = mx.argpartition(-fsub, kth=width - 1, axis=-1)[:, :width]
        vals = mx.take_along_axis(fsub, best, axis=-1)
        order = mx.take_along_axis(best, mx.argsort(-vals, axis=-1), axis=-1)
    else:
        order = mx.argsort(-fsub, axis=-1)
    sorted_l = mx.take_along_axis(fsub, order, axis=-1)
    ranks = mx.arange(width)[None, :]
    sorted_l = mx.where(ranks >= fcol(a.top_k), _MASK, sorted_l)
    probs = mx.softmax(sorted_l, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
    drop_p = (mx.cumsum(probs, axis=-1) - probs) > fcol(a.top_p)
    drop_min = probs < fcol(a.min_p) * probs[:, :1]
    sorted_l = mx.where(drop_p | drop_min, _MASK, sorted_l)
    if _cut_to_survivors():  # the survivors form a prefix: draw over the longest one only
        keep = max(1, int(np.array(mx.max(mx.sum(sorted_l > _MASK, axis=-1)))))
        order, sorted_l = order[:, :keep], sorted_l[:, :keep]
    choice = mx.argmax(sorted_l + gumbel_noise(_keys(a, f), hashes[order]), axis=-1)
    tokens[mx.array(f)] = mx.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(mx.uint32)
    return tokens


class DrawnTokens:
    """A step's draw as lazy arrays (nothing evaluated yet): result() evaluates them and hands the tokens, and the
    logprobs asked for, to the host. `tokens` feed a step launched after this one (its carried ids)."""

    def __init__(
        self,
        tokens: mx.array,
        rows: list[SamplingRow],
        chosen: mx.array | None = None,
        top: tuple[mx.array, mx.array] | None = None,
        scored: PromptLogprobs | None = None,
    ) -> None:
        self.tokens, self.rows, self.chosen, self.top, self.scored = tokens, rows, chosen, top, scored

    def arrays(self) -> list[mx.array]:
        """What evaluating the step means (for mx.async_eval)."""
        return [self.tokens] + ([self.chosen] if self.chosen is not None else []) + list(self.top or ())

    def result(self) -> StepOutput:
        mx.eval(*self.arrays())
        if self.chosen is None:
            return StepOutput(token_ids=_list(self.tokens), prompt_logprobs=self.scored)
        ids = vals = None
        if self.top is not None:
            ids, vals = _list(self.top[0]), _list(self.top[1])
        return StepOutput(
            token_ids=_list(self.tokens),
            logprobs=_list(self.chosen),
            top_logprobs=top_logprobs_lists(self.rows, ids, vals),
            prompt_logprobs=self.scored,
        )


def _cut_to_survivors() -> bool:
    """Whether a filtered draw reads back how many columns survive, to draw over them alone: on a CPU, where the
    noise costs more than the read; not on a GPU (Metal, CUDA), where the read would evaluate the step before its
    launch returns (async scheduling). The dropped columns are at -inf: the token is the same either way."""
    return mx.default_device() == mx.cpu


def sample(logits: mx.array, rows: list[SamplingRow]) -> StepOutput:
    """logits [B, V] (one row per sampled sequence) -> chosen token ids (+ logprobs)."""
    return draw(logits, rows).result()


def draw(logits: mx.array, rows: list[SamplingRow]) -> DrawnTokens:
    """sample()'s work as lazy arrays, not yet evaluated."""
    logits = logits.astype(mx.float32)
    b, vocab = logits.shape
    a = prepare_sampling(rows, vocab)
    raw_logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if a.max_logprobs is not None else None
    if a.edits_logits:
        logits = _edit_logits(logits, a)
    if not a.random_rows:
        tokens = mx.argmax(logits, axis=-1)
    elif len(a.random_rows) == b:
        tokens = _sample_random(logits, a)
    else:
        tokens = mx.argmax(logits, axis=-1)
        r = mx.array(a.random_rows)
        tokens[r] = _sample_random(logits[r], a).astype(tokens.dtype)
    if raw_logprobs is None:
        return DrawnTokens(tokens, rows)
    chosen = mx.take_along_axis(raw_logprobs, tokens[:, None].astype(mx.int32), axis=-1)[:, 0]
    if not a.max_logprobs:
        return DrawnTokens(tokens, rows, chosen)
    top_ids = mx.argsort(-raw_logprobs, axis=-1)[:, : a.max_logprobs]
    return DrawnTokens(tokens, rows, chosen, (top_ids, mx.take_along_axis(raw_logprobs, top_ids, axis=-1)))


def prompt_logprobs(logits: mx.array, entries: list[PromptRows]) -> PromptLogprobs:
    """logits [R, V]: the rows of `entries` in order -> each prompt target's log-probability there (of the model's
    raw distribution, as sampled tokens' logprobs are) and the most likely tokens."""
    logits = logits.astype(mx.float32)
    raw = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    targets = mx.array([t for e in entries for t in e.targets])
    chosen = mx.take_along_axis(raw, targets[:, None], axis=1)
    ranks = (raw >= chosen).sum(axis=-1).tolist()  # (1: the most likely; ties counted, as vLLM counts them)
    k = min(max(e.top for e in entries), raw.shape[-1])
    ids = vals = None
    if k:
        top_ids = mx.argsort(-raw, axis=-1)[:, :k]
        ids, vals = top_ids.tolist(), mx.take_along_axis(raw, top_ids, axis=1).tolist()
    return prompt_logprob_lists(entries, chosen[:, 0].tolist(), ranks, ids, vals)
