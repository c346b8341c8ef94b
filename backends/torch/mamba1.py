"""Mamba-1's selective scan in plain torch, float32 throughout.

Per channel c, with a = dt_c A_c (A < 0: every decay exp(a) is at most 1) and u = dt_c x_c, each token does
    S_c <- exp(a) * S_c + u B;  y_c = S_c . C + D_c x_c                 (S_c, B, C: [N])
Decode rows take that step, batched over sequences. A prefill takes it a chunk of T tokens at a time: with the
chunk's cumulative decays G [T, channels, N], y_i = sum_{j<=i} C_i . (exp(G_i - G_j) u_j B_j) + C_i . (exp(G_i) S0)
and the end state is exp(G_T) S0 + sum_j exp(G_T - G_j) u_j B_j. Unlike Mamba-2's scalar decay per head, the decay
differs per (channel, state) pair, so the chunk's [T, T, channels, N] weights are made whole: T is chosen to keep
them small (family_mamba.scan_chunk_length).
"""

from __future__ import annotations

import torch

from lantern.app.models.family_mamba import scan_chunk_length


def per_channel(v: torch.Tensor, channels: int) -> torch.Tensor:
    """B or C as [rows, channels or 1, N]: one per token [rows, N] broadcast over the channels (Mamba), or one per
    head [rows, H, N] repeated over each head's channels (Zamba's heads: expanded a chunk at a time, not per prompt)."""
    if v.dim() == 2:
        return v[:, None, :]
    return v.repeat_interleave(channels // v.shape[1], dim=1) if v.shape[1] != channels else v


def step(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x, dt [S, C] (dt after softplus), a = A [C, N], b, c [S, N] (or [S, H, N]: per
    head), D [C], state [S, C, N]. Returns (y [S, C], the new state)."""
    xf, channels = x.float(), x.shape[1]
    state = state * (dt[..., None] * a).exp() + (dt * xf)[..., None] * per_channel(b.float(), channels)
    y = (state * per_channel(c.float(), channels)).sum(-1) + d * xf
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
    """One sequence's tokens: x, dt [L, C], A [C, N], b, c [L, N] (or [L, H, N]), D [C], state [C, N] -> (y [L, C],
    the state)."""
    length, channels = x.shape
    xf, b, c = x.float(), b.float(), c.float()
    u = dt * xf
    size = scan_chunk_length(channels, a.shape[-1])
    out = torch.empty(length, channels, dtype=torch.float32, device=x.device)
    for start in range(0, length, size):
        end = min(start + size, length)
        n = end - start
        cum = (dt[start:end, :, None] * a).cumsum(0)  # [T, C, N]
        lower = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[:, :, None, None]
        diff = cum[:, None] - cum[None, :]  # G_i - G_j: [i, j, C, N]
        weights = torch.where(lower, diff, torch.full_like(diff, -torch.inf)).exp()
        inputs = u[start:end, :, None] * per_channel(b[start:end], channels)  # u_j B_j: [T, C, N]
        held = (weights * inputs[None]).sum(1) + cum.exp() * state  # each token's state [T, C, N]
        out[start:end] = (held * per_channel(c[start:end], channels)).sum(-1)
        state = held[-1]
    return out + d * xf, state
