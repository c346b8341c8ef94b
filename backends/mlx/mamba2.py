"""Mamba-2's selective state-space scan (SSD) in MLX (the maths of backends/torch/mamba2.py, which says
how the chunked form works), float32 throughout, with ops MLX runs on Metal, CPU and CUDA alike.
"""

from __future__ import annotations

import mlx.core as mx

CHUNK = 64


def _per_head(t: mx.array, heads: int) -> mx.array:
    """B or C [..., G, N] -> [..., H, N]: head h reads group h // (H / G)."""
    return mx.repeat(t, heads // t.shape[-2], axis=-2)


def step(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, d: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per sequence: x [S, H, P], dt [S, H], A [H], b, c [S, G, N], D [H], state [S, H, P, N]."""
    heads, xf = x.shape[1], x.astype(mx.float32)
    b, c = _per_head(b.astype(mx.float32), heads), _per_head(c.astype(mx.float32), heads)
    state = state * mx.exp(dt * a)[..., None, None] + (dt[..., None] * xf)[..., None] * b[:, :, None, :]
    y = (state @ c[..., None])[..., 0] + d[:, None] * xf
    return y, state


def chunked(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, d: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One sequence: x [L, H, P], dt [L, H], A [H], b, c [L, G, N], D [H], state [H, P, N] -> (y, state)."""
    length, heads = x.shape[0], x.shape[1]
    xf = x.astype(mx.float32)
    b, c = _per_head(b.astype(mx.float32), heads), _per_head(c.astype(mx.float32), heads)
    skip = d[:, None] * xf
    pad = -length % CHUNK
    if pad:  # padded tokens have dt = 0: no decay, no input
        xf, b, c = (mx.pad(t, [(0, pad), (0, 0), (0, 0)]) for t in (xf, b, c))
        dt = mx.pad(dt, [(0, pad), (0, 0)])
    n = xf.shape[0] // CHUNK
    xdt = (xf * dt[..., None]).reshape(n, CHUNK, heads, -1).transpose(2, 0, 1, 3)  # [H, n, C, P]
    b, c = (t.reshape(n, CHUNK, heads, -1).transpose(2, 0, 1, 3) for t in (b, c))  # [H, n, C, N]
    cum = mx.cumsum((dt * a).reshape(n, CHUNK, heads).transpose(2, 0, 1), axis=-1)
    lower = mx.tril(mx.ones((CHUNK, CHUNK), dtype=mx.bool_))
    diff = cum[..., :, None] - cum[..., None, :]
    decay = mx.exp(mx.where(lower, diff, -mx.inf))  # exp(G_i - G_j) for j <= i
    inner = ((c @ b.swapaxes(-1, -2)) * decay) @ xdt  # [H, n, C, P]
    c_decayed = c * mx.exp(cum)[..., None]
    to_end = b * mx.exp(cum[..., -1:] - cum)[..., None]
    last = mx.exp(cum[..., -1])  # [H, n]
    outs = []
    for k in range(n):
        outs.append(inner[:, k] + c_decayed[:, k] @ state.swapaxes(-1, -2))
        state = state * last[:, k, None, None] + xdt[:, k].swapaxes(-1, -2) @ to_end[:, k]
    y = mx.stack(outs, axis=1).transpose(1, 2, 0, 3).reshape(n * CHUNK, heads, -1)[:length]
    return y + skip, state
