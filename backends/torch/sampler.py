"""On-device sampling (torch) for one step; semantics and the noise function in backends/sampling_prep.py.
On CUDA the Gumbel-max draw is one Triton kernel (kernels/triton_sampling.py), the same values as the ops here.

Logprobs are the model's raw log-probabilities (before logit_bias, penalties and temperature), as
vLLM reports them. On a CPU with Lantern's native ops (use_native_cpu_ops), the noisy argmax and the
greedy argmax run in one pass each (kernels/cpu_sampling.c), bit for bit the torch code below:
SmolLM2's 49152 columns, 2 cores, T = 1: ~0.32 -> ~0.04 ms a row alone, ~5.5 -> ~0.66 ms for 32 rows;
greedy ~85 -> ~9 us a row, ~0.7 -> ~0.11 ms for 32.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from lantern.app.engine.contract import PromptLogprobs, PromptRows, SamplingRow, StepOutput
from lantern.backends.sampling_prep import (
    M32,
    MIX_C1,
    MIX_C2,
    SamplingArrays,
    mask_bytes,
    prepare_sampling,
    prompt_logprob_lists,
    top_logprobs_lists,
)

_MASK = -float("inf")
_TORCH_DTYPES = {"f4": torch.float32, "f8": torch.float64, "i4": torch.int32, "i8": torch.int64}  # (numpy's codes)
_native = False  # torch.ops.lantern's noisy_argmax / row_argmax serve CPU rows (use_native_cpu_ops)
# Noise elements made at once: bounds the scratch (two int32 buffers) at any batch size. On a 2-core
# Xeon (1.25 MB L2 per core) 2^18 measured best (~15-20% ahead of 2^16, 2^17 and 2^19): smaller
# chunks pay ~20 ops' dispatch each (and below 2^16 stop splitting over the threads), larger ones
# leave L2. A GPU wants few launches.
_NOISE_ELEMS = {"cpu": 1 << 18}
_NOISE_ELEMS_DEFAULT = 1 << 23
# Block widths of the two-level argmax (row_argmax): torch.argmax's CPU kernel is ~5x slower than a
# vectorized amax over blocks followed by an argmax over the block maxima and one block.
_ARGMAX_BLOCKS = (256, 128, 64)


def use_native_cpu_ops() -> bool:
    """Load (building it the first time, ~30 s) the native op library so that CPU rows sample through
    it; whether they will. The torch runner calls it while loading a model, so no request waits."""
    global _native
    from lantern.backends.torch import cpu_vnni_gemm  # the op library's loader

    _native = cpu_vnni_gemm.available()
    return _native


def _native_for(x: torch.Tensor) -> bool:
    return _native and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1


def _i32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


@lru_cache(maxsize=8)
def _consts(device: torch.device) -> dict[str, torch.Tensor]:
    """0-dim operands made once: a Python-int scalar costs ~5-12 us of conversion per op, which at
    ~10 ops per chunk is as much as the arithmetic itself on a 2^17-element chunk.

    The hash runs in int32: products wrap mod 2^32 (two's complement), the same bits as uint32, and
    a logical right shift by s is an arithmetic one masked to the low 32 - s bits. Both multipliers
    are below 2^31, so they are valid int32 values as they are."""
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=device)
    return {
        "c1": i32(MIX_C1),
        "c2": i32(MIX_C2),
        "s9": i32(9),
        "s15": i32(15),
        "lo17": i32((1 << 17) - 1),
        "lo23": i32((1 << 23) - 1),
        "half_ulp": f32(2.0**-24),
    }


def _xorshift16_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 values (taken mod 2^32) -> int32 bits of w ^ (w >>> 16), lowbias32's first step. That
    step is linear over xor, so for mix32(c) ^ key it is applied to both halves ahead of time."""
    w = x.bitwise_and(M32)
    w = w.bitwise_xor_(w >> 16)
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32)


@lru_cache(maxsize=8)
def column_hashes(vocab: int, device: torch.device) -> torch.Tensor:
    """int32 [vocab]: the key-independent half of the hash, made once: xorshift16(mix32(column))."""
    x = torch.arange(vocab, dtype=torch.int64, device=device)
    tmp = torch.empty_like(x)
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp).mul_(MIX_C1).bitwise_and_(M32)
    torch.bitwise_right_shift(x, 15, out=tmp)
    x.bitwise_xor_(tmp).mul_(MIX_C2).bitwise_and_(M32)
    torch.bitwise_right_shift(x, 15, out=tmp)
    return _xorshift16_int32(x.bitwise_xor_(tmp))


def _mix_core_(a: torch.Tensor, b: torch.Tensor, keys16: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """a <- y, int32 [R, C], where mix32(mix32(column) ^ key) = y ^ (y >>> 15); b is scratch."""
    k = _consts(a.device)
    torch.bitwise_xor(col_hashes, keys16, out=a)
    a.mul_(k["c1"])
    torch.bitwise_right_shift(a, k["s15"], out=b)
    a.bitwise_xor_(b.bitwise_and_(k["lo17"]))
    return a.mul_(k["c2"])


def noise_bits(keys: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """keys [R, 1] int64 (32-bit), col_hashes [R, C] or [C] (column_hashes) -> int64 [R, C] in [0, 2^32)."""
    a, b = _scratch(torch.broadcast_shapes(keys.shape, col_hashes.shape), keys.device)
    _mix_core_(a, b, _xorshift16_int32(keys), col_hashes)
    torch.bitwise_right_shift(a, 15, out=b)
    a.bitwise_xor_(b.bitwise_and_((1 << 17) - 1))
    return a.to(torch.int64).bitwise_and_(M32)


def _neg_gumbel_(a: torch.Tensor, b: torch.Tensor, keys16: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """log(-log(u)) = -gumbel, float32 in a's memory, with u = ((bits >> 9) + 0.5) / 2^23 (exact in
    float32, never 0 or 1). Only bits >>> 9 is needed: with y from _mix_core_ and t = y >>> 9 it is
    t ^ (t >> 15), a shift that needs no mask as t >= 0."""
    k = _consts(a.device)
    _mix_core_(a, b, keys16, col_hashes)
    torch.bitwise_right_shift(a, k["s9"], out=b)
    b.bitwise_and_(k["lo23"])
    torch.bitwise_right_shift(b, k["s15"], out=a)
    b.bitwise_xor_(a)
    u = a.view(torch.float32)  # a is free again: the float passes reuse it
    u.copy_(b)
    # (t + 0.5) * 2^-23 as 2^-24 + t * 2^-23 in one pass: every term and sum is exact in float32.
    torch.add(k["half_ulp"], u, alpha=2.0**-23, out=u)
    return u.log_().neg_().log_()


def _scratch(shape: torch.Size, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.empty(shape, dtype=torch.int32, device=device)
    return a, torch.empty_like(a)


def gumbel_noise(keys: torch.Tensor, col_hashes: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float32 [R, C], a pure function of (key, column)."""
    a, b = _scratch(torch.broadcast_shapes(keys.shape, col_hashes.shape), keys.device)
    return _neg_gumbel_(a, b, _xorshift16_int32(keys), col_hashes).neg_()


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1) of a contiguous [R, C] float tensor (first index of the maximum, NaN
    counting as the maximum), via the first block holding the row's maximum: the block maxima are
    exact, so the first such block holds the first maximal column."""
    if _native_for(x) and x.shape[1] > 0:
        return torch.ops.lantern.row_argmax(x)
    rows, cols = x.shape
    width = next((w for w in _ARGMAX_BLOCKS if cols % w == 0), _ARGMAX_BLOCKS[-1])
    nb = cols // width
    if x.device.type != "cpu" or nb < 4 or not x.is_contiguous():
        return torch.argmax(x, dim=-1)
    head = nb * width
    blocks = x[:, :head].unflatten(-1, (nb, width))
    block_max = torch.amax(blocks, dim=-1)
    blk = torch.argmax(block_max, dim=-1, keepdim=True)
    first = torch.gather(blocks, 1, blk[:, :, None].expand(rows, 1, width))[:, 0]
    idx = torch.argmax(first, dim=-1).add_(blk[:, 0], alpha=width)
    if head == cols:
        return idx
    # Columns past the last whole block win only if strictly greater (or the first NaN).
    tail = x[:, head:]
    t_idx = torch.argmax(tail, dim=-1, keepdim=True)
    head_v, tail_v = block_max.gather(1, blk)[:, 0], tail.gather(1, t_idx)[:, 0]
    take = (tail_v > head_v) | (tail_v.isnan() & ~head_v.isnan())
    return torch.where(take, t_idx[:, 0] + head, idx)


def _argmax_with_noise(
    scores: torch.Tensor, keys: torch.Tensor, col_hashes: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """argmax(scores + temperature * gumbel) per row (= argmax(scores / T + gumbel), without a
    division pass over the logits), in row chunks so the scratch stays small and is reused."""
    if scores.is_cuda and scores.shape[1] > 0 and _triton_draw(scores):
        from lantern.backends.torch.kernels import triton_sampling

        drawn = triton_sampling.noisy_argmax(scores, keys, col_hashes, temperature)
        if drawn is not None:
            return drawn
    if _native_for(scores) and scores.shape[1] > 0:
        temps = torch.empty(0) if temperature is None else temperature.float().contiguous()
        keys16, hashes = _xorshift16_int32(keys), col_hashes.contiguous()
        return torch.ops.lantern.noisy_argmax(scores, hashes, keys16, temps, _i32(MIX_C1), _i32(MIX_C2))
    rows, cols = scores.shape
    limit = _NOISE_ELEMS.get(scores.device.type, _NOISE_ELEMS_DEFAULT)
    step = min(rows, max(1, limit // max(1, cols)))
    keys16 = _xorshift16_int32(keys)
    buf_a, buf_b = _scratch(torch.Size([step * cols]), scores.device)
    out = []
    for s in range(0, rows, step):
        e = min(rows, s + step)
        a, b = buf_a[: (e - s) * cols].view(e - s, cols), buf_b[: (e - s) * cols].view(e - s, cols)
        hashes = col_hashes if col_hashes.dim() == 1 else col_hashes[s:e]
        ng = _neg_gumbel_(a, b, keys16[s:e], hashes)
        if temperature is not None:  # two rounded ops, as on MLX (no FMA): the same token on both
            ng.mul_(temperature[s:e])
        out.append(row_argmax(torch.sub(scores[s:e], ng, out=ng)))
    return out[0] if len(out) == 1 else torch.cat(out)


def _triton_draw(scores: torch.Tensor) -> bool:
    """Whether a CUDA draw takes triton_sampling's one kernel (as ops.use_triton decides for the model's ops)."""
    from lantern.backends.torch.kernels import ops

    return ops.use_triton(scores) and scores.dtype == torch.float32


def _triton_draw_rows(sub: torch.Tensor, keys: np.ndarray, temps: np.ndarray) -> torch.Tensor | None:
    """The draw of unfiltered rows on CUDA: their keys and temperatures go over in one asynchronous copy from pinned
    memory (float64 holds both exactly: keys are 32-bit), so the host queues the kernel behind the forward without
    waiting for it (a copy from pageable memory would wait for the whole step first)."""
    from lantern.backends.torch.kernels import triton_sampling

    plain = bool((temps == 1.0).all())  # T = 1, the clients' default: no scaling
    pin = torch.cuda.is_available()  # (pinned always on a GPU; tests run this on a CPU as well)
    host = torch.empty((1 if plain else 2, len(keys)), dtype=torch.float64, pin_memory=pin)
    staged = host.numpy()
    staged[0] = keys.reshape(-1)
    if not plain:
        staged[1] = temps.reshape(-1)
    params = host.to(sub.device, non_blocking=True)
    return triton_sampling.noisy_argmax(
        sub, params[0], column_hashes(sub.shape[1], sub.device), None if plain else params[1]
    )


def _upload(dev: torch.device, arrays: list[np.ndarray]) -> list[torch.Tensor]:
    """Small host arrays on the device in their dtypes, through one copy: float64 holds each exactly (32-bit keys,
    counts and row numbers, float32 values). On CUDA the copy is asynchronous, from pinned memory: a blocking one
    (torch.tensor(..., device=...)) would make the host wait for the whole stream -- the step launched before it
    too, which async scheduling runs while the host prepares this one (app/engine/step_ahead.py)."""
    cuda = dev.type == "cuda"
    host = torch.empty(sum(x.size for x in arrays), dtype=torch.float64, pin_memory=cuda)
    staged, at = host.numpy(), 0
    for x in arrays:
        staged[at : at + x.size] = x.reshape(-1)
        at += x.size
    moved = host.to(dev, non_blocking=True) if cuda else host
    out, at = [], 0
    for x in arrays:
        out.append(moved[at : at + x.size].view(x.shape).to(_TORCH_DTYPES[x.dtype.str[1:]]))
        at += x.size
    return out


def _cut_to_survivors(scores: torch.Tensor) -> bool:
    """Whether a filtered draw reads back how many columns survive, to draw over them alone: on a CPU, where the
    noise costs more than the read; not on a GPU, where the read would make the host wait for the step (the
    dropped columns are at -inf: they never win, and the others keep their noise, so the token is the same)."""
    return not scores.is_cuda


def _edit_logits(logits: torch.Tensor, a: SamplingArrays) -> torch.Tensor:
    """logit_bias, penalties and bans as sparse edits of the flat [B * vocab] view (in place)."""
    flat = logits.view(-1)
    dev = logits.device
    t = lambda x: torch.from_numpy(x).to(dev)
    edits = {
        "bias": (a.bias_flat, a.bias_values),
        "rep": (a.rep_flat, a.rep_values),
        "freq": (a.freq_flat, a.freq_values),
    }
    edits = {k: v for k, v in edits.items() if v[0] is not None and v[1] is not None}
    arrays = [x for pair in edits.values() for x in pair] + ([a.banned_flat] if a.banned_flat is not None else [])
    up = iter(_upload(dev, arrays) if arrays else [])  # (in the order above: one copy)
    if "bias" in edits:
        flat.index_add_(0, next(up), next(up))
    if "rep" in edits:
        # HF/vLLM repetition penalty: shrink positive logits, push negative ones further down.
        idx, rep = next(up), next(up)
        v = flat[idx]
        flat[idx] = torch.where(v > 0, v / rep, v * rep)
    if "freq" in edits:
        # OpenAI frequency/presence penalties count generated tokens only.
        idx, values = next(up), next(up)
        flat.index_add_(0, idx, -values)
    if a.banned_flat is not None:
        flat[next(up)] = _MASK
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
    if not a.filter_rows and sub.is_cuda and sub.shape[1] > 0 and _triton_draw(sub):
        drawn = _triton_draw_rows(sub, a.draw_keys, temps_np)
        if drawn is not None:
            return drawn
    plain = sorted(set(range(len(idx))) - set(a.filter_rows))
    arrays = [temps_np, a.draw_keys]
    if a.filter_rows:
        fcol = lambda x: x[idx][a.filter_rows]
        arrays += [np.asarray(plain, np.int64), np.asarray(a.filter_rows, np.int64)]
        arrays += [fcol(a.top_k), fcol(a.top_p), fcol(a.min_p)]
    temps, keys, *filtering = _upload(dev, arrays)
    plain_t = None if (temps_np == 1.0).all() else temps  # T = 1, the clients' default: no scaling pass
    vocab = sub.shape[-1]
    hashes = column_hashes(vocab, dev)
    if not a.filter_rows:
        return _argmax_with_noise(sub, keys, hashes, plain_t)
    pl, f, top_k, top_p, min_p = filtering
    tokens = torch.empty(len(idx), dtype=torch.int64, device=dev)
    if plain:
        tokens[pl] = _argmax_with_noise(sub[pl], keys[pl], hashes, None if plain_t is None else temps[pl])
    # Rows with top-k/top-p/min-p: rank their best columns, mask, and draw among the survivors
    # with the same per-column noise (so the filter decides only which columns may win).
    fsub = sub[f] / temps[f]  # top-p and min-p act on the probabilities at temperature T
    width = a.filter_width
    if width < vocab:
        sorted_l, order = torch.topk(fsub, width, dim=-1)
    else:
        sorted_l, order = torch.sort(fsub, dim=-1, descending=True, stable=True)
    ranks = torch.arange(width, device=dev)[None, :]
    sorted_l = sorted_l.masked_fill(ranks >= top_k, _MASK)
    probs = torch.softmax(sorted_l, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
    drop_p = (torch.cumsum(probs, dim=-1) - probs) > top_p
    drop_min = probs < min_p * probs[:, :1]
    sorted_l = sorted_l.masked_fill(drop_p | drop_min, _MASK)
    if _cut_to_survivors(sorted_l):  # the survivors form a prefix: draw over the longest one only
        keep = max(1, int((sorted_l > _MASK).sum(dim=-1).max()))
        order, sorted_l = order[:, :keep], sorted_l[:, :keep]
    choice = _argmax_with_noise(sorted_l, keys[f], hashes[order])
    tokens[f] = order.gather(1, choice[:, None])[:, 0]
    return tokens


class DrawnTokens:
    """A step's draw queued on the device (the kernels launched, nothing read back): result() copies the tokens, and
    the logprobs asked for, to the host. `tokens` stay on the device for a step launched after this one (its carried
    ids), so the host need not wait for them first."""

    def __init__(
        self,
        tokens: torch.Tensor,
        rows: list[SamplingRow],
        chosen: torch.Tensor | None = None,
        top: tuple[torch.Tensor, torch.Tensor] | None = None,
        scored: PromptLogprobs | None = None,
    ) -> None:
        self.tokens, self.rows, self.chosen, self.top, self.scored = tokens, rows, chosen, top, scored

    def result(self) -> StepOutput:
        if self.chosen is None:
            return StepOutput(token_ids=self.tokens.tolist(), prompt_logprobs=self.scored)
        ids = vals = None
        if self.top is not None:
            ids, vals = self.top[1].tolist(), self.top[0].tolist()
        return StepOutput(
            token_ids=self.tokens.tolist(),
            logprobs=self.chosen.tolist(),
            top_logprobs=top_logprobs_lists(self.rows, ids, vals),
            prompt_logprobs=self.scored,
        )


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> StepOutput:
    """logits [B, V] (one row per sampled sequence) -> chosen token ids (+ logprobs)."""
    return draw(logits, rows).result()


def draw(logits: torch.Tensor, rows: list[SamplingRow]) -> DrawnTokens:
    """sample()'s device work: the chosen tokens (+ logprobs) as device tensors, not yet read back."""
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
        tokens = row_argmax(logits.contiguous())
    elif len(a.random_rows) == b:
        tokens = _sample_random(logits, a)
    else:
        tokens = row_argmax(logits.contiguous())
        (r,) = _upload(logits.device, [np.asarray(a.random_rows, np.int64)])
        tokens[r] = _sample_random(logits[r], a)
    if raw is None:
        return DrawnTokens(tokens, rows)
    chosen = raw.gather(1, tokens[:, None])[:, 0]
    top = torch.topk(raw, a.max_logprobs, dim=-1) if a.max_logprobs else None
    return DrawnTokens(tokens, rows, chosen, (top[0], top[1]) if top is not None else None)


def prompt_logprobs(logits: torch.Tensor, entries: list[PromptRows]) -> PromptLogprobs:
    """logits [R, V]: the rows of `entries` in order -> each prompt target's log-probability there (of the model's
    raw distribution, as sampled tokens' logprobs are) and the most likely tokens."""
    raw = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor([t for e in entries for t in e.targets], device=raw.device)
    chosen = raw.gather(1, targets[:, None])
    ranks = (raw >= chosen).sum(dim=-1).tolist()  # (1: the most likely; ties counted, as vLLM counts them)
    k = max(e.top for e in entries)
    ids = vals = None
    if k:
        top_vals, top_ids = torch.topk(raw, min(k, raw.shape[-1]), dim=-1)
        ids, vals = top_ids.tolist(), top_vals.tolist()
    return prompt_logprob_lists(entries, chosen[:, 0].tolist(), ranks, ids, vals)
