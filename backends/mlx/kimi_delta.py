"""Kimi Delta Attention's rule in MLX (the maths of backends/torch/kimi_delta.py, which says how the chunked form
works with a decay per key channel): products and sums only, every op on Metal, CPU and CUDA alike; float32."""

from __future__ import annotations

import mlx.core as mx

from lantern.backends.mlx.gated_delta import _inverse_unit_lower

CHUNK = 64


def recurrent_step(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per sequence: q, k, g [B, H, dk], v [B, H, dv], beta [B, H], state [B, H, dk, dv]."""
    state = state * mx.exp(g)[..., None]
    memory = (state * k[..., :, None]).sum(-2)
    delta = (v - memory) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (state * q[..., :, None]).sum(-2), state


def chunked(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One sequence: q, k, g [L, H, dk], v [L, H, dv], beta [L, H], state [H, dk, dv] -> (o [L, H, dv], state)."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:  # padded tokens: k = 0, beta = 0, g = 0 leave the state as it is
        q, k, v, g = (mx.pad(t, [(0, pad), (0, 0), (0, 0)]) for t in (q, k, v, g))
        beta = mx.pad(beta, [(0, pad), (0, 0)])
    n, heads = q.shape[0] // CHUNK, q.shape[1]
    q, k, v, g = (t.reshape(n, CHUNK, heads, t.shape[-1]).transpose(2, 0, 1, 3) for t in (q, k, v, g))
    beta = beta.reshape(n, CHUNK, heads).transpose(2, 0, 1)
    cum = mx.cumsum(g, axis=-2)
    lower = mx.tril(mx.ones((CHUNK, CHUNK), dtype=mx.bool_))[..., None]
    eye = mx.eye(CHUNK, dtype=mx.float32)
    kb = k * beta[..., None]
    last = mx.exp(cum[..., -1, :])  # [H, n, dk]
    q_decayed = q * mx.exp(cum)
    k_to_end = k * mx.exp(cum[..., -1:, :] - cum)
    outs = []
    for c in range(n):
        g_c = cum[:, c]  # [H, C, dk]
        decay = mx.exp(mx.where(lower, g_c[:, :, None, :] - g_c[:, None, :, :], -mx.inf))  # [H, C, C, dk], j <= i
        k_c = k[:, c][:, None, :, :]
        strict = ((kb[:, c][:, :, None, :] * k_c) * decay).sum(-1) * (1 - eye)
        scores = ((q[:, c][:, :, None, :] * k_c) * decay).sum(-1)
        inv = _inverse_unit_lower(strict + eye)
        w = inv @ (kb[:, c] * mx.exp(g_c))
        u = inv @ (v[:, c] * beta[:, c, :, None]) - w @ state
        outs.append(q_decayed[:, c] @ state + scores @ u)
        state = state * last[:, c, :, None] + k_to_end[:, c].swapaxes(-1, -2) @ u
    out = mx.stack(outs, axis=1).transpose(1, 2, 0, 3).reshape(n * CHUNK, heads, v.shape[-1])
    return out[:length], state
