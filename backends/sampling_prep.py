"""Backend-neutral preparation of one step's sampling inputs (numpy), shared by every sampler.

A backend turns these arrays into device arrays and applies, in this order: penalties, bans,
temperature, top-k, top-p, min-p, then a Gumbel-max draw whose noise depends only on
(seed, step) so a row draws the same token alone or batched.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.batch import SamplingRow


def draw_seed(seed: int, step: int) -> int:
    """The per-(seed, step) random seed of one draw."""
    return (seed * 1_000_003 + step) & 0xFFFFFFFFFFFF


@dataclass
class SamplingArrays:
    vocab: int
    temperature: np.ndarray  # [B, 1] float32 (1.0 on greedy rows: unused there)
    top_k: np.ndarray  # [B, 1] int64, vocab when disabled
    top_p: np.ndarray  # [B, 1] float32
    min_p: np.ndarray  # [B, 1] float32
    random_rows: list[int]  # rows that sample (temperature > 0); the rest take the argmax
    draw_seeds: list[int]  # one per random row
    # Penalties (None when no row uses them): flat indices into a [B * vocab] view.
    repetition: np.ndarray | None = None  # [B, 1]
    frequency: np.ndarray | None = None
    presence: np.ndarray | None = None
    seen_flat: np.ndarray | None = None  # prompt + output tokens of rows with repetition penalty
    output_flat: np.ndarray | None = None  # generated tokens (with repeats) of rows with penalties
    banned_flat: np.ndarray | None = None  # tokens a row may not draw now (EOS before min_tokens)
    max_logprobs: int | None = None  # None: no row wants logprobs


def prepare_sampling(rows: list[SamplingRow], vocab: int) -> SamplingArrays:
    b = len(rows)
    col = lambda values, dtype: np.asarray(values, dtype=dtype).reshape(b, 1)  # noqa: E731
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    arrays = SamplingArrays(
        vocab=vocab,
        temperature=col([r.params.temperature or 1.0 for r in rows], np.float32),
        top_k=col([r.params.top_k or vocab for r in rows], np.int64),
        top_p=col([r.params.top_p for r in rows], np.float32),
        min_p=col([r.params.min_p for r in rows], np.float32),
        random_rows=random_rows,
        draw_seeds=[draw_seed(rows[i].seed, rows[i].step) for i in random_rows],
    )
    if any(r.params.uses_penalties for r in rows):
        seen, out = [], []
        for i, r in enumerate(rows):
            p = r.params
            if not p.uses_penalties:
                continue
            if p.repetition_penalty != 1.0:
                ids = np.unique(np.asarray(r.prompt_token_ids + r.output_token_ids, dtype=np.int64))
                seen.append(i * vocab + ids)
            out.append(i * vocab + np.asarray(r.output_token_ids, dtype=np.int64))
        arrays.repetition = col([r.params.repetition_penalty for r in rows], np.float32)
        arrays.frequency = col([r.params.frequency_penalty for r in rows], np.float32)
        arrays.presence = col([r.params.presence_penalty for r in rows], np.float32)
        arrays.seen_flat = np.concatenate(seen) if seen else np.zeros(0, np.int64)
        arrays.output_flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    banned = [i * vocab + np.asarray([t for t in r.banned_token_ids if 0 <= t < vocab], dtype=np.int64)
              for i, r in enumerate(rows) if r.banned_token_ids]
    if banned:
        arrays.banned_flat = np.concatenate(banned)
    wants = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    arrays.max_logprobs = max(wants) if wants else None
    return arrays


def top_logprobs_lists(rows: list[SamplingRow], ids: list[list[int]] | None, vals: list[list[float]] | None
                       ) -> list[list[tuple[int, float]]]:
    out = []
    for r, row in enumerate(rows):
        n = row.params.logprobs or 0
        out.append(list(zip(ids[r][:n], vals[r][:n])) if n and ids is not None else [])
    return out
