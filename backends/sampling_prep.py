"""Backend-neutral preparation of one step's sampling inputs (numpy), shared by every sampler.

A backend turns these arrays into device arrays and applies, in this order (vLLM's): logit_bias,
repetition penalty, frequency/presence penalties, bans, the token mask (constrained decoding:
grammar / allowed_token_ids), temperature, top-k, top-p, min-p, then a Gumbel-max draw (or the
argmax on greedy rows). Raw logprobs are taken before all of it.

The draw's noise is a pure function of (draw key, column), computed on the device with plain
integer ops, so a row draws the same token alone or batched, and the same on every backend:

    key      = draw_seed(seed, step)                        32-bit, mixed on the host
    bits     = mix32(mix32(column) ^ key)                   uint32 arithmetic (mod 2^32)
    u        = ((bits >> 9) + 0.5) / 2^23                   in (0, 1), exact in float32
    gumbel   = -log(-log(u))

mix32 is the "lowbias32" integer hash found by Chris Wellons' hash-prospector (constants
0x21f0aaad, 0x735a2d97), a bijection of 32-bit words with near-ideal avalanche. Both multipliers
are below 2^31, so a backend without uint32 arithmetic (torch) computes the same bits in int32:
products wrap mod 2^32 and a logical right shift is an arithmetic one masked to its low bits
(backends/torch/sampler.py). `gumbel_noise` below is the numpy
reference that the backends are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lantern.app.engine.contract import PromptLogprobs, PromptRows, SamplingRow

MIX_C1 = 0x21F0AAAD
MIX_C2 = 0x735A2D97
M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
# Below this temperature a row takes the argmax: dividing by it would overflow float32 (vLLM's eps).
MIN_TEMPERATURE = 1e-5


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def draw_seed(seed: int, step: int) -> int:
    """The 32-bit key of draw `step` of a sequence seeded `seed` (any int; distinct per step)."""
    return _splitmix64(_splitmix64(int(seed) & _M64) ^ (int(step) & _M64)) >> 32


def mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint32 arrays (numpy wraps uint32 products mod 2^32)."""
    x = x.astype(np.uint32, copy=True)
    x ^= x >> np.uint32(16)
    x *= np.uint32(MIX_C1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(MIX_C2)
    x ^= x >> np.uint32(15)
    return x


def noise_bits(keys: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Reference hash: keys [R, 1], cols [R, C] or [C] -> uint32 [R, C]."""
    with np.errstate(over="ignore"):
        return mix32(mix32(np.asarray(cols, dtype=np.uint32)) ^ np.asarray(keys, dtype=np.uint32))


def gumbel_noise(keys: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Reference Gumbel noise (float32) of the draws `keys` at vocabulary columns `cols`."""
    u = ((noise_bits(keys, cols) >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-23)
    return -np.log(-np.log(u))


@dataclass
class SamplingArrays:
    vocab: int
    temperature: np.ndarray  # [B, 1] float32 (1.0 on greedy rows: unused there)
    top_k: np.ndarray  # [B, 1] int64, vocab when disabled
    top_p: np.ndarray  # [B, 1] float32
    min_p: np.ndarray  # [B, 1] float32
    random_rows: list[int]  # rows that sample (temperature > 0); the rest take the argmax
    draw_keys: np.ndarray  # [len(random_rows), 1] int64: draw_seed of each random row
    # Positions within random_rows of the rows that filter (top-k, top-p or min-p), and how many
    # of the best columns they need: the largest top_k among them, or the vocabulary.
    filter_rows: list[int]
    filter_width: int
    # Sparse edits, as flat indices into a [B * vocab] view plus one value per index.
    bias_flat: np.ndarray | None = None  # logit_bias: added
    bias_values: np.ndarray | None = None
    rep_flat: np.ndarray | None = None  # ids seen (prompt + output) of rows with repetition_penalty
    rep_values: np.ndarray | None = None  # that row's penalty: x / p if x > 0 else x * p
    freq_flat: np.ndarray | None = None  # generated ids of rows with frequency/presence penalties
    freq_values: np.ndarray | None = None  # count * frequency_penalty + presence_penalty: subtracted
    banned_flat: np.ndarray | None = None  # tokens a row may not draw now (EOS before min_tokens)
    # Constrained rows and their packed allowed-token bits [len(mask_rows), words] int32, or None
    # when no row is constrained. Bit i of word w is token 32w + i; columns past the words: forbidden.
    mask_rows: list[int] | None = None
    token_mask: np.ndarray | None = None
    max_logprobs: int | None = None  # None: no row wants logprobs

    @property
    def edits_logits(self) -> bool:
        fields = (self.bias_flat, self.rep_flat, self.freq_flat, self.banned_flat, self.token_mask)
        return any(x is not None for x in fields)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray | None:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else None


def prepare_sampling(rows: list[SamplingRow], vocab: int) -> SamplingArrays:
    b = len(rows)
    col = lambda values, dtype: np.asarray(values, dtype=dtype).reshape(b, 1)
    random_rows = [i for i, r in enumerate(rows) if r.params.temperature >= MIN_TEMPERATURE]
    top_k = [min(r.params.top_k or vocab, vocab) for r in rows]
    filters = [
        j
        for j, i in enumerate(random_rows)
        if top_k[i] < vocab or rows[i].params.top_p < 1.0 or rows[i].params.min_p > 0.0
    ]
    arrays = SamplingArrays(
        vocab=vocab,
        temperature=col(
            [r.params.temperature if r.params.temperature >= MIN_TEMPERATURE else 1.0 for r in rows], np.float32
        ),
        top_k=col(top_k, np.int64),
        top_p=col([r.params.top_p for r in rows], np.float32),
        min_p=col([r.params.min_p for r in rows], np.float32),
        random_rows=random_rows,
        draw_keys=np.asarray([draw_seed(rows[i].seed, rows[i].step) for i in random_rows], np.int64).reshape(-1, 1),
        filter_rows=filters,
        filter_width=max((top_k[random_rows[j]] for j in filters), default=vocab),
    )
    bias_idx, bias_val, rep_idx, rep_val, freq_idx, freq_val = [], [], [], [], [], []
    for i, r in enumerate(rows):
        p, base = r.params, i * vocab
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), np.int64, len(p.logit_bias))
            vals = np.fromiter(p.logit_bias.values(), np.float32, len(p.logit_bias))
            ok = (ids >= 0) & (ids < vocab)  # the engine validates ids; never index out of the row
            bias_idx.append(base + ids[ok])
            bias_val.append(vals[ok])
        if not p.uses_penalties:
            continue
        if r.penalty is None:
            raise ValueError("a row with penalties needs its PenaltyState (build_batch sets SamplingRow.penalty)")
        if p.repetition_penalty != 1.0:
            seen = r.penalty.seen_ids()
            rep_idx.append(base + seen)
            rep_val.append(np.full(seen.shape[0], p.repetition_penalty, np.float32))
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            freq_idx.append(base + r.penalty.output_ids())
            freq_val.append(r.penalty.output_counts() * p.frequency_penalty + p.presence_penalty)
    arrays.bias_flat, arrays.bias_values = _cat(bias_idx, np.int64), _cat(bias_val, np.float32)
    arrays.rep_flat, arrays.rep_values = _cat(rep_idx, np.int64), _cat(rep_val, np.float32)
    arrays.freq_flat, arrays.freq_values = _cat(freq_idx, np.int64), _cat(freq_val, np.float32)
    banned = [
        i * vocab + np.asarray([t for t in r.banned_token_ids if 0 <= t < vocab], dtype=np.int64)
        for i, r in enumerate(rows)
        if r.banned_token_ids
    ]
    if banned:
        arrays.banned_flat = np.concatenate(banned)
    arrays.mask_rows, arrays.token_mask = _token_mask(rows)
    wants = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    arrays.max_logprobs = max(wants) if wants else None
    return arrays


def _token_mask(rows: list[SamplingRow]) -> tuple[list[int] | None, np.ndarray | None]:
    idx = [i for i, r in enumerate(rows) if r.token_bitmask is not None]
    if not idx:
        return None, None
    masks = [np.asarray(rows[i].token_bitmask, dtype=np.int32) for i in idx]
    out = np.zeros((len(idx), max(m.shape[0] for m in masks)), dtype=np.int32)
    for j, m in enumerate(masks):
        out[j, : m.shape[0]] = m  # a shorter mask forbids the columns it does not cover
    return idx, out


def mask_bytes(token_mask: np.ndarray) -> np.ndarray:
    """Packed int32 masks [R, W] as bytes [R, 4W]: byte k of a row holds tokens 8k..8k+7, bit j
    token 8k + j (the words' little-endian layout, as llguidance writes them)."""
    words = np.ascontiguousarray(token_mask, dtype="<i4")  # explicit: the layout on any host
    return words.view(np.uint8).reshape(words.shape[0], -1)


def top_logprobs_lists(
    rows: list[SamplingRow], ids: list[list[int]] | None, vals: list[list[float]] | None
) -> list[list[tuple[int, float]]]:
    out: list[list[tuple[int, float]]] = []
    for r, row in enumerate(rows):
        n = row.params.logprobs or 0
        if not n or ids is None or vals is None:
            out.append([])
            continue
        out.append(list(zip(ids[r][:n], vals[r][:n], strict=True)))
    return out


def prompt_logprob_lists(
    entries: list[PromptRows],
    chosen: list[float],
    ranks: list[int],
    ids: list[list[int]] | None,
    vals: list[list[float]] | None,
) -> PromptLogprobs:
    """Flat per-row results (the rows of `entries` in order: each target's logprob and rank, the top ids and values
    at its row, as many as the largest `top` asked) split per entry, each row's alternatives cut to its entry's
    `top`."""
    out: PromptLogprobs = []
    at = 0
    for e in entries:
        rows = []
        for r in range(at, at + len(e.targets)):
            top = [] if ids is None or vals is None else list(zip(ids[r][: e.top], vals[r][: e.top], strict=True))
            rows.append((chosen[r], ranks[r], top))
        out.append(rows)
        at += len(e.targets)
    return out
