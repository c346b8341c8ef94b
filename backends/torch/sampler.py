"""On-device sampling (torch) for one step; semantics in backends/sampling_prep.py."""
from __future__ import annotations

import torch

from app.engine.batch import SamplingRow, StepOutput
from backends.sampling_prep import SamplingArrays, prepare_sampling, top_logprobs_lists

_MASK = -float("inf")


def _gumbel(seed: int, vocab: int, device: torch.device) -> torch.Tensor:
    # Drawn on the CPU generator so a seed gives the same noise on every device.
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(vocab, generator=gen, dtype=torch.float64).clamp_(1e-20, 1.0 - 1e-12)
    return (-torch.log(-torch.log(u))).to(device, torch.float32)


def _apply_penalties(logits: torch.Tensor, a: SamplingArrays) -> torch.Tensor:
    b, vocab = logits.shape
    dev = logits.device
    counts = torch.zeros(b * vocab, device=dev)
    if a.output_flat.size:
        counts.index_add_(0, torch.from_numpy(a.output_flat).to(dev), torch.ones(a.output_flat.size, device=dev))
    counts = counts.view(b, vocab)
    seen = torch.zeros(b * vocab, dtype=torch.bool, device=dev)
    if a.seen_flat.size:
        seen[torch.from_numpy(a.seen_flat).to(dev)] = True
    seen = seen.view(b, vocab)
    rep = torch.from_numpy(a.repetition).to(dev)
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    freq, pres = torch.from_numpy(a.frequency).to(dev), torch.from_numpy(a.presence).to(dev)
    return logits - counts * freq - (counts > 0).float() * pres


def _sample_random(logits: torch.Tensor, a: SamplingArrays) -> torch.Tensor:
    dev = logits.device
    idx = a.random_rows
    col = lambda x: torch.from_numpy(x[idx]).to(dev)  # noqa: E731
    sub = logits[torch.tensor(idx, device=dev)] / col(a.temperature)
    vocab = sub.shape[-1]
    sorted_l, order = torch.sort(sub, dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=dev)[None, :]
    sorted_l = sorted_l.masked_fill(ranks >= col(a.top_k), _MASK)
    probs = torch.softmax(sorted_l, dim=-1)
    drop_p = (torch.cumsum(probs, dim=-1) - probs) > col(a.top_p)
    drop_min = probs < col(a.min_p) * probs[:, :1]
    sorted_l = sorted_l.masked_fill(drop_p | drop_min, _MASK)
    noise = torch.stack([_gumbel(s, vocab, dev) for s in a.draw_seeds])
    choice = torch.argmax(sorted_l + noise, dim=-1)
    return order.gather(1, choice[:, None])[:, 0]


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> StepOutput:
    logits = logits.float()
    b, vocab = logits.shape
    a = prepare_sampling(rows, vocab)
    raw = torch.log_softmax(logits, dim=-1) if a.max_logprobs is not None else None
    if a.repetition is not None:
        logits = _apply_penalties(logits, a)
    if a.banned_flat is not None:
        logits = logits.reshape(-1).index_fill(0, torch.from_numpy(a.banned_flat).to(logits.device), _MASK).view(b, vocab)
    tokens = torch.argmax(logits, dim=-1)
    if a.random_rows:
        tokens[torch.tensor(a.random_rows, device=logits.device)] = _sample_random(logits, a)
    if raw is None:
        return StepOutput(token_ids=tokens.tolist())
    chosen = raw.gather(1, tokens[:, None])[:, 0]
    ids = vals = None
    if a.max_logprobs:
        top_vals, top_ids = torch.topk(raw, a.max_logprobs, dim=-1)
        ids, vals = top_ids.tolist(), top_vals.tolist()
    return StepOutput(token_ids=tokens.tolist(), logprobs=chosen.tolist(),
                      top_logprobs=top_logprobs_lists(rows, ids, vals))
