"""The gated delta rule and its causal convolution in MLX (the maths of backends/torch/gated_delta.py,
which says how the chunked form works). Only ops MLX runs on Metal, CPU and CUDA alike: no
triangular solve (the chunk's unit lower-triangular inverse is built block by block) and the
depthwise convolution as a sum of K shifted products. Everything in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

CHUNK = 64


class Conv(nn.Module):
    """A depthwise causal convolution's weight [channels, 1, kernel] (Hugging Face's layout)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = mx.zeros((channels, 1, kernel))


def l2norm(x: mx.array) -> mx.array:
    return x * mx.rsqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def conv_step(
    x: mx.array, window: mx.array, weight: mx.array, bias: mx.array | None = None, silu: bool = True
) -> tuple[mx.array, mx.array]:
    """One token per sequence: x [B, C], window [B, C, K-1], weight [C, 1, K] -> (conv [B, C], window)."""
    full = mx.concatenate([window, x[:, :, None]], axis=-1)
    out = (full.astype(mx.float32) * weight[:, 0, :].astype(mx.float32)).sum(-1)  # one rounding
    if bias is not None:
        out = out + bias.astype(mx.float32)
    return (nn.silu(out) if silu else out).astype(x.dtype), full[:, :, 1:]


def conv_chunk(
    x: mx.array, window: mx.array, weight: mx.array, bias: mx.array | None = None, silu: bool = True
) -> tuple[mx.array, mx.array]:
    """One sequence's chunk: x [L, C], window [C, K-1] -> (conv [L, C], SiLU'd unless silu is False, window)."""
    length, kernel = x.shape[0], weight.shape[-1]
    full = mx.concatenate([window.T, x], axis=0)  # [K-1+L, C]
    wide, w = full.astype(mx.float32), weight.astype(mx.float32)
    out = wide[0:length] * w[:, 0, 0]
    for j in range(1, kernel):
        out = out + wide[j : j + length] * w[:, 0, j]
    if bias is not None:
        out = out + bias.astype(mx.float32)
    return (nn.silu(out) if silu else out).astype(x.dtype), full[length:].T


def recurrent_step(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per sequence: q, k [B, H, dk], v [B, H, dv], g, beta [B, H], state [B, H, dk, dv]."""
    state = state * mx.exp(g)[..., None, None]
    memory = (state * k[..., :, None]).sum(-2)
    delta = (v - memory) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (state * q[..., :, None]).sum(-2), state


def _inverse_unit_lower(m: mx.array) -> mx.array:
    """m^-1 for unit lower-triangular m [..., C, C], C a power of two (torch's gated_delta says how)."""
    size, lead = m.shape[-1], m.shape[:-2]
    inv = mx.ones((*lead, size, 1, 1), dtype=m.dtype)
    width = 1
    while width < size:
        pairs = size // (2 * width)
        tiles = m.reshape(*lead, pairs, 2 * width, pairs, 2 * width)
        blocks = mx.moveaxis(mx.diagonal(tiles, axis1=-4, axis2=-2), -1, -3)
        upper, lower = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        corner = -(lower @ blocks[..., width:, :width] @ upper)
        top = mx.concatenate([upper, mx.zeros_like(upper)], axis=-1)
        inv = mx.concatenate([top, mx.concatenate([corner, lower], axis=-1)], axis=-2)
        width *= 2
    return inv[..., 0, :, :]


def chunked(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One sequence: q, k [L, H, dk], v [L, H, dv], g, beta [L, H], state [H, dk, dv] -> (o [L, H, dv], state)."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:  # padded tokens: k = 0, beta = 0, g = 0 leave the state as it is
        q, k, v = (mx.pad(t, [(0, pad), (0, 0), (0, 0)]) for t in (q, k, v))
        g, beta = mx.pad(g, [(0, pad), (0, 0)]), mx.pad(beta, [(0, pad), (0, 0)])
    n, heads = q.shape[0] // CHUNK, q.shape[1]
    q, k, v = (t.reshape(n, CHUNK, heads, t.shape[-1]).transpose(2, 0, 1, 3) for t in (q, k, v))
    g, beta = (t.reshape(n, CHUNK, heads).transpose(2, 0, 1) for t in (g, beta))
    cum = mx.cumsum(g, axis=-1)
    lower = mx.tril(mx.ones((CHUNK, CHUNK), dtype=mx.bool_))
    diff = cum[..., :, None] - cum[..., None, :]
    decay = mx.exp(mx.where(lower, diff, -mx.inf))  # exp(G_i - G_j) for j <= i
    kb = k * beta[..., None]
    strict = (kb @ k.swapaxes(-1, -2)) * mx.tril(decay, -1)
    inv = _inverse_unit_lower(strict + mx.eye(CHUNK, dtype=strict.dtype))
    w = inv @ (kb * mx.exp(cum)[..., None])
    u0 = inv @ (v * beta[..., None])
    scores = (q @ k.swapaxes(-1, -2)) * decay
    q_decayed = q * mx.exp(cum)[..., None]
    k_to_end = k * mx.exp(cum[..., -1:] - cum)[..., None]
    last = mx.exp(cum[..., -1])  # [H, n]
    outs = []
    for c in range(n):
        u = u0[:, c] - w[:, c] @ state
        outs.append(q_decayed[:, c] @ state + scores[:, c] @ u)
        state = state * last[:, c, None, None] + k_to_end[:, c].swapaxes(-1, -2) @ u
    out = mx.stack(outs, axis=1).transpose(1, 2, 0, 3).reshape(n * CHUNK, heads, v.shape[-1])
    return out[:length], state


def over_batch(
    meta: Any,
    mixed: mx.array,
    conv_w: mx.array,
    windows: mx.array,
    matrices: mx.array,
    heads: Callable[[mx.array, Any], tuple[mx.array, ...]],
    step: Callable[..., tuple[mx.array, mx.array]],
    chunk: Callable[..., tuple[mx.array, mx.array]],
) -> tuple[mx.array, mx.array, mx.array]:
    """One layer's delta rule over a step's flattened batch (torch's gated_delta.over_batch says how): returns (the
    output rows in the batch's order, the windows, the states)."""
    pieces: list[mx.array] = []  # decode rows first, then each prefill
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        fresh = meta.decode_state_fresh  # a one-token prompt starts from zeros (where, not a product: 0 * NaN)
        window = mx.where(fresh[:, None, None], 0, windows[slots])
        conv, windows[slots] = conv_step(mixed[rows], window, conv_w)
        q, k, v, g, beta = heads(conv, rows)
        out, matrices[slots] = step(q, k, v, g, beta, mx.where(fresh[:, None, None, None], 0, matrices[slots]))
        pieces.append(out)
    for p in meta.prefills:
        span, slot = slice(p.q_start, p.q_end), p.state_slot
        first = p.first_pos == 0
        window = mx.zeros_like(windows[slot]) if first else windows[slot]
        conv, windows[slot] = conv_chunk(mixed[span], window, conv_w)
        q, k, v, g, beta = heads(conv, span)
        out, matrices[slot] = chunk(q, k, v, g, beta, mx.zeros_like(matrices[slot]) if first else matrices[slot])
        pieces.append(out)
    out = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
    if meta.restore_order is not None:
        out = out[meta.restore_order]
    return out, windows, matrices
