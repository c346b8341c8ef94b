"""Mamba-1's selective scan in MLX (the maths of backends/torch/mamba1.py, which says how the chunked form works),
float32 throughout, with ops MLX runs on Metal, CPU and CUDA alike."""

from __future__ import annotations

import mlx.core as mx

from lantern.app.models.family_mamba import scan_chunk_length


def per_channel(v: mx.array, channels: int) -> mx.array:
    """B or C as [rows, channels or 1, N] (see backends/torch/mamba1.py): [rows, N] broadcast, [rows, H, N] repeated."""
    if v.ndim == 2:
        return v[:, None, :]
    return mx.repeat(v, channels // v.shape[1], axis=1) if v.shape[1] != channels else v


def step(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, d: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per sequence: x, dt [S, C], A [C, N], b, c [S, N] (or [S, H, N]: per head), D [C], state
    [S, C, N] -> (y [S, C], state)."""
    xf, channels = x.astype(mx.float32), x.shape[1]
    state = state * mx.exp(dt[..., None] * a) + (dt * xf)[..., None] * per_channel(b.astype(mx.float32), channels)
    y = (state * per_channel(c.astype(mx.float32), channels)).sum(-1) + d * xf
    return y, state


def chunked(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, d: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One sequence's tokens: x, dt [L, C], A [C, N], b, c [L, N] (or [L, H, N]), D [C], state [C, N] -> (y [L, C],
    the state)."""
    length, channels = x.shape
    xf, b, c = x.astype(mx.float32), b.astype(mx.float32), c.astype(mx.float32)
    u = dt * xf
    size = scan_chunk_length(channels, a.shape[-1])
    outs = []
    for start in range(0, length, size):
        end = min(start + size, length)
        n = end - start
        cum = mx.cumsum(dt[start:end, :, None] * a, axis=0)  # [T, C, N]
        lower = mx.tril(mx.ones((n, n), dtype=mx.bool_))[:, :, None, None]
        weights = mx.exp(mx.where(lower, cum[:, None] - cum[None, :], -mx.inf))  # exp(G_i - G_j), j <= i
        inputs = u[start:end, :, None] * per_channel(b[start:end], channels)
        held = (weights * inputs[None]).sum(1) + mx.exp(cum) * state
        outs.append((held * per_channel(c[start:end], channels)).sum(-1))
        state = held[-1]
    y = outs[0] if len(outs) == 1 else mx.concatenate(outs)
    return y + d * xf, state
