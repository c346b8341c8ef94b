"""The gated delta rule (gated DeltaNet linear attention) and its causal convolution, in plain torch.

Per value head, with a state S [d_k, d_v], each token does
    S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q
(q and k l2-normed, q scaled by d_k^-0.5 by the caller). Decode rows take that step directly,
batched over sequences. A prefill takes it `CHUNK` tokens at a time in the chunked (WY) form: within
a chunk with cumulative log-decays G, the pseudo-values U solve (I + diag(beta) A) U = diag(beta) (V -
diag(exp G) K S0) with A[i, j] = exp(G_i - G_j) k_i.k_j for j < i; the unit lower-triangular inverse is
built from its diagonal blocks, doubled in width each round (matrix products only, as the MLX file
does: no triangular solve there on every device). Everything runs in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 64


class Conv(nn.Module):
    """A depthwise causal convolution's weight [channels, 1, kernel] (Hugging Face's layout; the models
    name it, conv_step / conv_chunk read it)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel), requires_grad=False)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, as transformers and FLA compute it."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def conv_step(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [B, C], window [B, C, K-1] (the previous inputs), weight [C, 1, K].
    Returns (conv [B, C], SiLU'd unless silu is False (LFM2), the new window)."""
    full = torch.cat([window, x[:, :, None]], dim=-1)
    out = (full.float() * weight[:, 0, :].float()).sum(-1)  # one rounding, as a convolution kernel makes
    if bias is not None:
        out = out + bias.float()
    return (F.silu(out) if silu else out).to(x.dtype), full[:, :, 1:]


def conv_chunk(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill chunk of one sequence: x [L, C], window [C, K-1]. Returns (conv [L, C], new window)."""
    full = torch.cat([window, x.t()], dim=-1)  # [C, K-1+L]
    b = None if bias is None else bias.float()
    out = F.conv1d(full[None].float(), weight.float(), b, groups=weight.shape[0])[0]  # [C, L]
    return (F.silu(out) if silu else out).t().to(x.dtype), full[:, full.shape[1] - window.shape[1] :]


def recurrent_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k [B, H, dk], v [B, H, dv], g, beta [B, H], state [B, H, dk, dv]."""
    state = state * g.exp()[..., None, None]
    delta = (v - torch.einsum("bhkv,bhk->bhv", state, k)) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def _inverse_unit_lower(m: torch.Tensor) -> torch.Tensor:
    """m^-1 for unit lower-triangular m [..., C, C], C a power of two: diagonal blocks of the inverse
    doubled in width each round, [[A, 0], [X, B]]^-1 = [[A^-1, 0], [-B^-1 X A^-1, B^-1]] (what FLA's
    solve_tril does; a power series (I + N)(I + N^2)... cancels catastrophically on similar keys)."""
    size, lead = m.shape[-1], m.shape[:-2]
    inv = torch.ones(*lead, size, 1, 1, dtype=m.dtype, device=m.device)  # the 1 x 1 diagonal blocks
    width = 1
    while width < size:
        pairs = size // (2 * width)
        blocks = m.reshape(*lead, pairs, 2 * width, pairs, 2 * width).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)
        upper, lower = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        corner = -(lower @ blocks[..., width:, :width] @ upper)
        top = torch.cat([upper, torch.zeros_like(upper)], dim=-1)
        inv = torch.cat([top, torch.cat([corner, lower], dim=-1)], dim=-2)
        width *= 2
    return inv[..., 0, :, :]


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's tokens: q, k [L, H, dk], v [L, H, dv], g, beta [L, H], state [H, dk, dv].
    Returns (o [L, H, dv], the final state)."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:  # padded tokens have k = 0, beta = 0, g = 0: they neither decay nor change the state
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, 0, 0, pad)), F.pad(beta, (0, 0, 0, pad))
    n = q.shape[0] // CHUNK
    # [H, n, C, d] and [H, n, C]
    q, k, v = (t.reshape(n, CHUNK, t.shape[1], t.shape[2]).permute(2, 0, 1, 3) for t in (q, k, v))
    g, beta = (t.reshape(n, CHUNK, t.shape[1]).permute(2, 0, 1) for t in (g, beta))
    cum = g.cumsum(-1)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    diff = cum[..., :, None] - cum[..., None, :]
    decay = torch.where(lower, diff, torch.full_like(diff, -torch.inf)).exp()  # exp(G_i - G_j), j <= i
    kb = k * beta[..., None]
    strict = (kb @ k.transpose(-1, -2)) * decay.tril(-1)
    inv = _inverse_unit_lower(strict + torch.eye(CHUNK, dtype=strict.dtype, device=strict.device))
    w = inv @ (kb * cum.exp()[..., None])  # [H, n, C, dk]
    u0 = inv @ (v * beta[..., None])  # [H, n, C, dv]
    scores = (q @ k.transpose(-1, -2)) * decay  # [H, n, C, C]
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    last = cum[..., -1].exp()  # [H, n]
    out = torch.empty_like(v)
    for c in range(n):
        u = u0[:, c] - w[:, c] @ state
        out[:, c] = q_decayed[:, c] @ state + scores[:, c] @ u
        state = state * last[:, c, None, None] + k_to_end[:, c].transpose(-1, -2) @ u
    out = out.permute(1, 2, 0, 3).reshape(n * CHUNK, -1, v.shape[-1])
    return out[:length], state


def over_batch(
    meta: Any,
    mixed: torch.Tensor,
    conv_w: torch.Tensor,
    windows: torch.Tensor,
    matrices: torch.Tensor,
    heads: Callable[[torch.Tensor, Any], tuple[torch.Tensor, ...]],
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    chunk: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
) -> None:
    """One layer's delta rule over a step's flattened batch: the decode rows one token each (`step`, batched over
    their state slots), each prefill chunk its own (`chunk`), from zeros where a sequence starts (a one-token prompt,
    a chunk at position 0), so a slot needs no clearing. `heads(conv, rows)`: the convolved q/k/v of those rows ->
    (q, k, v, g, beta); each rule's output goes to `out` at its rows, the windows and states are updated in place."""
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        fresh = meta.decode_state_fresh[:, None, None]
        window = windows[slots].masked_fill(fresh, 0)
        conv, windows[slots] = conv_step(mixed[rows], window, conv_w)
        q, k, v, g, beta = heads(conv, rows)
        out[rows], matrices[slots] = step(q, k, v, g, beta, matrices[slots].masked_fill(fresh[..., None], 0))
    for p in meta.prefills:
        span, slot = slice(p.q_start, p.q_end), p.state_slot
        first = p.ctx_len == p.q_end - p.q_start  # the chunk starts at position 0
        window = torch.zeros_like(windows[slot]) if first else windows[slot]
        conv, windows[slot] = conv_chunk(mixed[span], window, conv_w)
        q, k, v, g, beta = heads(conv, span)
        out[span], matrices[slot] = chunk(
            q, k, v, g, beta, torch.zeros_like(matrices[slot]) if first else matrices[slot]
        )
