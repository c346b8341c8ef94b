"""On-device sampling (torch) for one step; semantics and the noise function in backends/sampling_prep.py.

Logprobs are the model's raw log-probabilities (before logit_bias, penalties and temperature), as
vLLM reports them.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from lantern.app.engine.contract import SamplingRow, StepOutput
from lantern.backends.sampling_prep import (
    M32,
    MIX_C1,
    MIX_C2,
    SamplingArrays,
    mask_bytes,
    prepare_sampling,
    top_logprobs_lists,
)

_MASK = -float("inf")
# Noise elements made at once: bounds the int64 scratch (2 x 8 bytes each) at any batch size. On a
# CPU a chunk that stays in cache is ~2x faster than one pass over [32, 128k]; a GPU wants few launches.
_NOISE_ELEMS = {"cpu": 1 << 19}
_NOISE_ELEMS_DEFAULT = 1 << 23


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """lowbias32 in place on int64 values in [0, 2^32): exact, as both constants are < 2^31."""
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp).mul_(MIX_C1).bitwise_and_(M32)
    torch.bitwise_right_shift(x, 15, out=tmp)
    x.bitwise_xor_(tmp).mul_(MIX_C2).bitwise_and_(M32)
    torch.bitwise_right_shift(x, 15, out=tmp)
    return x.bitwise_xor_(tmp)


@lru_cache(maxsize=8)
def column_hashes(vocab: int, device: torch.device) -> torch.Tensor:
    """mix32(column) for every column: the key-independent half of the hash, made once."""
    x = torch.arange(vocab, dtype=torch.int64, device=device)
    return _mix32_(x, torch.empty_like(x))


def noise_bits(keys: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """keys [R, 1] int64 (32-bit), col_hashes [R, C] or [C] = mix32(columns) -> int64 [R, C] in [0, 2^32)."""
    x = torch.bitwise_xor(col_hashes, keys)
    return _mix32_(x, torch.empty_like(x))


def _neg_gumbel(keys: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """log(-log(u)) = -gumbel, with u = ((bits >> 9) + 0.5) / 2^23 (exact in float32, never 0 or 1)."""
    x = noise_bits(keys, col_hashes)
    x.bitwise_right_shift_(9)
    return x.to(torch.float32).add_(0.5).mul_(2.0**-23).log_().neg_().log_()


def gumbel_noise(keys: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float32 [R, C], a pure function of (key, column)."""
    return _neg_gumbel(keys, col_hashes).neg_()


def _argmax_with_noise(
    scores: torch.Tensor, keys: torch.Tensor, col_hashes: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """argmax(scores + temperature * gumbel) per row (= argmax(scores / T + gumbel), without a
    division pass over the logits), in row chunks so the scratch stays small."""
    limit = _NOISE_ELEMS.get(scores.device.type, _NOISE_ELEMS_DEFAULT)
    step = max(1, limit // max(1, scores.shape[1]))
    out = []
    for s in range(0, scores.shape[0], step):
        hashes = col_hashes if col_hashes.dim() == 1 else col_hashes[s : s + step]
        ng = _neg_gumbel(keys[s : s + step], hashes)
        if temperature is not None:  # two rounded ops, as on MLX (no FMA): the same token on both
            ng.mul_(temperature[s : s + step])
        out.append(torch.argmax(torch.sub(scores[s : s + step], ng), dim=-1))
    return out[0] if len(out) == 1 else torch.cat(out)


def _edit_logits(logits: torch.Tensor, a: SamplingArrays) -> torch.Tensor:
    """logit_bias, penalties and bans as sparse edits of the flat [B * vocab] view (in place)."""
    flat = logits.view(-1)
    dev = logits.device
    t = lambda x: torch.from_numpy(x).to(dev)
    if a.bias_flat is not None and a.bias_values is not None:
        flat.index_add_(0, t(a.bias_flat), t(a.bias_values))
    if a.rep_flat is not None and a.rep_values is not None:
        # HF/vLLM repetition penalty: shrink positive logits, push negative ones further down.
        idx, rep = t(a.rep_flat), t(a.rep_values)
        v = flat[idx]
        flat[idx] = torch.where(v > 0, v / rep, v * rep)
    if a.freq_flat is not None and a.freq_values is not None:
        # OpenAI frequency/presence penalties count generated tokens only.
        flat.index_add_(0, t(a.freq_flat), -t(a.freq_values))
    if a.banned_flat is not None:
        flat[t(a.banned_flat)] = _MASK
    if a.mask_rows is not None and a.token_mask is not None:
        # x + 0 = x exactly and x + -inf = -inf: one add applies the mask.
        add = token_mask_addend(t(mask_bytes(a.token_mask)), logits.shape[1])
        if len(a.mask_rows) == logits.shape[0]:
            logits.add_(add)
        else:
            logits.index_add_(0, torch.tensor(a.mask_rows, device=dev), add)
    return logits


@lru_cache(maxsize=8)
def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: 0 where bit j of byte b is set, else -inf."""
    bits = (torch.arange(256, device=device)[:, None] >> torch.arange(8, device=device)) & 1
    return torch.zeros(256, 8, device=device).masked_fill_(bits == 0, _MASK)


def token_mask_addend(mask_u8: torch.Tensor, vocab: int) -> torch.Tensor:
    """Packed mask bytes [R, 4W] (mask_bytes) -> float32 [R, vocab]: 0 on allowed tokens, -inf on the
    rest, and on columns past the mask."""
    add = _byte_table(mask_u8.device)[mask_u8.long()].view(mask_u8.shape[0], -1)
    if add.shape[1] < vocab:
        add = torch.nn.functional.pad(add, (0, vocab - add.shape[1]), value=_MASK)
    return add[:, :vocab]


def _sample_random(sub: torch.Tensor, a: SamplingArrays) -> torch.Tensor:
    """Filtered Gumbel-max draw for the rows of `sub` (= logits[a.random_rows]); their token ids."""
    dev = sub.device
    idx = a.random_rows
    temps_np = a.temperature[idx]
    temps = torch.from_numpy(temps_np).to(dev)
    plain_t = None if (temps_np == 1.0).all() else temps  # T = 1, the clients' default: no scaling pass
    vocab = sub.shape[-1]
    keys = torch.from_numpy(a.draw_keys).to(dev)
    hashes = column_hashes(vocab, dev)
    if not a.filter_rows:
        return _argmax_with_noise(sub, keys, hashes, plain_t)
    tokens = torch.empty(len(idx), dtype=torch.int64, device=dev)
    plain = sorted(set(range(len(idx))) - set(a.filter_rows))
    if plain:
        pl = torch.tensor(plain, device=dev)
        tokens[pl] = _argmax_with_noise(sub[pl], keys[pl], hashes, None if plain_t is None else temps[pl])
    # Rows with top-k/top-p/min-p: rank their best columns, mask, and draw among the survivors
    # with the same per-column noise (so the filter decides only which columns may win).
    f = torch.tensor(a.filter_rows, device=dev)
    fcol = lambda x: torch.from_numpy(x[idx][a.filter_rows]).to(dev)
    fsub = sub[f] / temps[f]  # top-p and min-p act on the probabilities at temperature T
    width = a.filter_width
    if width < vocab:
        sorted_l, order = torch.topk(fsub, width, dim=-1)
    else:
        sorted_l, order = torch.sort(fsub, dim=-1, descending=True, stable=True)
    ranks = torch.arange(width, device=dev)[None, :]
    sorted_l = sorted_l.masked_fill(ranks >= fcol(a.top_k), _MASK)
    probs = torch.softmax(sorted_l, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
    drop_p = (torch.cumsum(probs, dim=-1) - probs) > fcol(a.top_p)
    drop_min = probs < fcol(a.min_p) * probs[:, :1]
    sorted_l = sorted_l.masked_fill(drop_p | drop_min, _MASK)
    keep = max(1, int((sorted_l > _MASK).sum(dim=-1).max()))  # survivors form a prefix
    order = order[:, :keep]
    choice = _argmax_with_noise(sorted_l[:, :keep], keys[f], hashes[order])
    tokens[f] = order.gather(1, choice[:, None])[:, 0]
    return tokens


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> StepOutput:
    """logits [B, V] (one row per sampled sequence) -> chosen token ids (+ logprobs)."""
    given = logits
    logits = logits.float()
    b, vocab = logits.shape
    a = prepare_sampling(rows, vocab)
    raw = torch.log_softmax(logits, dim=-1) if a.max_logprobs is not None else None
    if a.edits_logits:
        if logits.data_ptr() == given.data_ptr():
            logits = logits.clone()  # never edit the caller's tensor
        logits = _edit_logits(logits.contiguous(), a)
    if not a.random_rows:
        tokens = torch.argmax(logits, dim=-1)
    elif len(a.random_rows) == b:
        tokens = _sample_random(logits, a)
    else:
        tokens = torch.argmax(logits, dim=-1)
        r = torch.tensor(a.random_rows, device=logits.device)
        tokens[r] = _sample_random(logits[r], a)
    if raw is None:
        return StepOutput(token_ids=tokens.tolist())
    chosen = raw.gather(1, tokens[:, None])[:, 0]
    ids = vals = None
    if a.max_logprobs:
        top_vals, top_ids = torch.topk(raw, a.max_logprobs, dim=-1)
        ids, vals = top_ids.tolist(), top_vals.tolist()
    return StepOutput(
        token_ids=tokens.tolist(), logprobs=chosen.tolist(), top_logprobs=top_logprobs_lists(rows, ids, vals)
    )
