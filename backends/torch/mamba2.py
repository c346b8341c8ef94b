"""Mamba-2's selective state-space scan (SSD) in plain torch, float32 throughout.

Per head h, with a = dt A (A < 0, so the decay exp(a) is at most 1), each token does
    S <- exp(a) S + dt x B^T;  y = S C + D x             (S [P, N]; x [P]; B, C [N] of the head's group)
Decode rows take that step, batched over sequences. A prefill takes it CHUNK tokens at a time: within a
chunk with cumulative decays G, y_i = sum_{j<=i} exp(G_i - G_j) (C_i . B_j) dt_j x_j + exp(G_i) S0 C_i,
and the chunk's end state is exp(G_T) S0 + sum_j exp(G_T - G_j) dt_j x_j B_j^T (the SSD paper's block
decomposition; transformers' torch path computes the same with all chunks' states at once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """B or C [..., G, N] -> [..., H, N]: head h reads group h // (H / G)."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def step(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [S, H, P], dt [S, H] (after softplus), a = A [H], b, c [S, G, N], D [H],
    state [S, H, P, N]. Returns (y [S, H, P], the new state)."""
    heads = x.shape[1]
    b, c = _per_head(b.float(), heads), _per_head(c.float(), heads)
    state = state * (dt * a).exp()[..., None, None] + (dt[..., None] * x.float())[..., None] * b[:, :, None, :]
    y = torch.einsum("shpn,shn->shp", state, c) + d[:, None] * x.float()
    return y, state


def chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's tokens: x [L, H, P], dt [L, H], A [H], b, c [L, G, N], D [H], state [H, P, N].
    Returns (y [L, H, P], the final state)."""
    length, heads = x.shape[0], x.shape[1]
    xf, b, c = x.float(), _per_head(b.float(), heads), _per_head(c.float(), heads)
    skip = d[:, None] * xf
    pad = -length % CHUNK
    if pad:  # padded tokens have dt = 0: no decay, no input
        xf, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xf, b, c))
        dt = F.pad(dt, (0, 0, 0, pad))
    n = xf.shape[0] // CHUNK
    # [H, n, C, .] and [H, n, C]
    xdt = (xf * dt[..., None]).reshape(n, CHUNK, heads, -1).permute(2, 0, 1, 3)
    b, c = (t.reshape(n, CHUNK, heads, -1).permute(2, 0, 1, 3) for t in (b, c))
    cum = (dt * a).reshape(n, CHUNK, heads).permute(2, 0, 1).cumsum(-1)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=x.device).tril()
    diff = cum[..., :, None] - cum[..., None, :]
    decay = torch.where(lower, diff, torch.full_like(diff, -torch.inf)).exp()  # exp(G_i - G_j), j <= i
    inner = (c @ b.transpose(-1, -2)) * decay @ xdt  # [H, n, C, P]: the chunk's own tokens
    c_decayed = c * cum.exp()[..., None]  # [H, n, C, N]
    to_end = b * (cum[..., -1:] - cum).exp()[..., None]  # [H, n, C, N]
    last = cum[..., -1].exp()  # [H, n]
    out = torch.empty_like(inner)
    for k in range(n):
        out[:, k] = inner[:, k] + c_decayed[:, k] @ state.transpose(-1, -2)
        state = state * last[:, k, None, None] + xdt[:, k].transpose(-1, -2) @ to_end[:, k]
    y = out.permute(1, 2, 0, 3).reshape(n * CHUNK, heads, -1)[:length]
    return y + skip, state
