"""RWKV-7's per-sequence recurrences in MLX (maths in app/models/family_rwkv7.py): the token shift and the wkv state
update, over a decode batch (one token per sequence) and each sequence's prefill chunk; outputs in the step's token
order (restore_order: pieces come decode rows first, then each prefill)."""

from __future__ import annotations

import mlx.core as mx

from lantern.backends.mlx.paged_attention import AttentionMetadata


def _in_order(pieces: list[mx.array], meta: AttentionMetadata) -> mx.array:
    out = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
    return out if meta.restore_order is None else out[meta.restore_order]


def token_shift(x: mx.array, meta: AttentionMetadata, held: mx.array) -> tuple[mx.array, mx.array]:
    """(each token's previous input [T, D], zeros before a sequence's first token; held [slots, D] with each
    sequence's last input of this step)."""
    pieces = []
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        pieces.append(mx.where(meta.decode_state_fresh[:, None], 0, held[slots]))
        held[slots] = x[rows]
    for p in meta.prefills:
        before = mx.zeros_like(held[p.state_slot]) if p.first_pos == 0 else held[p.state_slot]
        pieces.append(mx.concatenate([before[None], x[p.q_start : p.q_end - 1]]))
        held[p.state_slot] = x[p.q_end - 1]
    return _in_order(pieces, meta), held


def wkv_step(
    s: mx.array, r: mx.array, w: mx.array, k: mx.array, v: mx.array, a: mx.array, b: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per state: s [..., H, Dv, Dk]; r, w, k, v, a, b [..., H, D] -> (y [..., H, Dv], new s).
    S <- S diag(w) + (S a) b^T + v k^T; y = S r."""
    s = s * w[..., None, :] + (s @ a[..., :, None]) @ b[..., None, :] + v[..., :, None] * k[..., None, :]
    return (s @ r[..., :, None])[..., 0], s


def wkv(
    meta: AttentionMetadata,
    states: mx.array,
    r: mx.array,
    w: mx.array,
    k: mx.array,
    v: mx.array,
    a: mx.array,
    b: mx.array,
) -> tuple[mx.array, mx.array]:
    """(y [T, H, D] in float32, states [slots, H, D, D] updated) for the step's tokens [T, H, D]."""
    f32 = [t.astype(mx.float32) for t in (r, w, k, v, a, b)]
    pieces = []
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        s = mx.where(meta.decode_state_fresh[:, None, None, None], 0, states[slots])
        y, states[slots] = wkv_step(s, *(t[rows] for t in f32))
        pieces.append(y)
    for p in meta.prefills:
        s = mx.zeros_like(states[p.state_slot]) if p.first_pos == 0 else states[p.state_slot]
        ys = []
        for i in range(p.q_start, p.q_end):  # (token by token: the state's update is sequential)
            y, s = wkv_step(s, *(t[i] for t in f32))
            ys.append(y)
        pieces.append(mx.stack(ys))
        states[p.state_slot] = s
    return _in_order(pieces, meta), states
