"""RWKV-7's per-sequence recurrences in torch (maths in app/models/family_rwkv7.py): the token shift and the wkv
state update, over a decode batch (one token per sequence) or one sequence's prefill chunk."""

from __future__ import annotations

import torch

from lantern.backends.torch.attention import TorchAttentionMetadata


def token_shift(x: torch.Tensor, meta: TorchAttentionMetadata, held: torch.Tensor) -> torch.Tensor:
    """Each token's previous input [T, D] (zeros before a sequence's first token), held [slots, D] updated to each
    sequence's last input of this step."""
    prev = torch.empty_like(x)
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        prev[rows] = held[slots].masked_fill(meta.decode_state_fresh[:, None], 0)
        held[slots] = x[rows]
    for p in meta.prefills:
        first = p.ctx_len == p.q_end - p.q_start  # the chunk starts at position 0
        before = torch.zeros_like(held[p.state_slot]) if first else held[p.state_slot]
        prev[p.q_start] = before
        prev[p.q_start + 1 : p.q_end] = x[p.q_start : p.q_end - 1]
        held[p.state_slot] = x[p.q_end - 1]
    return prev


def wkv_step(
    s: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per state: s [..., H, Dv, Dk]; r, w, k, v, a, b [..., H, D] -> (y [..., H, Dv], new s).
    S <- S diag(w) + (S a) b^T + v k^T; y = S r."""
    s = s * w[..., None, :] + (s @ a[..., :, None]) @ b[..., None, :] + v[..., :, None] * k[..., None, :]
    return (s @ r[..., :, None])[..., 0], s


def wkv(
    meta: TorchAttentionMetadata,
    states: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
) -> torch.Tensor:
    """The step's tokens through their sequences' states [slots, H, D, D] (float32, updated in place): y [T, H, D]
    in float32. The inputs are [T, H, D]."""
    y = torch.empty(r.shape, dtype=torch.float32, device=r.device)
    rows = meta.decode_token_idx
    if rows is not None:
        slots = meta.decode_state_slots
        s = states[slots].masked_fill(meta.decode_state_fresh[:, None, None, None], 0)
        y[rows], states[slots] = wkv_step(s, *(t[rows].float() for t in (r, w, k, v, a, b)))
    for p in meta.prefills:
        first = p.ctx_len == p.q_end - p.q_start
        s = torch.zeros_like(states[p.state_slot]) if first else states[p.state_slot]
        span = [t[p.q_start : p.q_end].float() for t in (r, w, k, v, a, b)]
        for i in range(p.q_end - p.q_start):  # (token by token: the state's update is sequential)
            y[p.q_start + i], s = wkv_step(s, *(t[i] for t in span))
        states[p.state_slot] = s
    return y
