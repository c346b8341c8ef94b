"""Kimi Delta Attention's rule in plain torch: the gated delta rule (gated_delta.py) with a decay per key channel.

Per head, with a state S [d_k, d_v], each token does
    S <- diag(exp(g)) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q
Decode rows take that step directly. A prefill takes it `CHUNK` tokens at a time in the chunked (WY) form of
gated_delta.chunked, with cumulative log-decays G [C, d_k] per channel: A[i, j] = sum_d k_i[d] k_j[d]
exp(G_i[d] - G_j[d]) and the scores q_i . k_j likewise, each exp(G_i - G_j) taken for j <= i only (never above 1:
the factored exp(G_i) exp(-G_j) would overflow for a fast decay). Everything in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lantern.backends.torch.gated_delta import _inverse_unit_lower

CHUNK = 64


def recurrent_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k, g [B, H, dk], v [B, H, dv], beta [B, H], state [B, H, dk, dv]."""
    state = state * g.exp()[..., None]
    delta = (v - torch.einsum("bhkv,bhk->bhv", state, k)) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's tokens: q, k, g [L, H, dk], v [L, H, dv], beta [L, H], state [H, dk, dv].
    Returns (o [L, H, dv], the final state)."""
    length = q.shape[0]
    pad = -length % CHUNK
    if pad:  # padded tokens have k = 0, beta = 0, g = 0: they neither decay nor change the state
        q, k, v, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = q.shape[0] // CHUNK
    # [H, n, C, d] and [H, n, C]
    q, k, v, g = (t.reshape(n, CHUNK, t.shape[1], t.shape[2]).permute(2, 0, 1, 3) for t in (q, k, v, g))
    beta = beta.reshape(n, CHUNK, beta.shape[1]).permute(2, 0, 1)
    cum = g.cumsum(-2)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    kb = k * beta[..., None]
    last = cum[..., -1, :].exp()  # [H, n, dk]
    q_decayed = q * cum.exp()
    k_to_end = k * (cum[..., -1:, :] - cum).exp()
    out = torch.empty_like(v)
    for c in range(n):
        g_c = cum[:, c]  # [H, C, dk]
        diff = g_c[:, :, None, :] - g_c[:, None, :, :]  # [H, C, C, dk]: G_i - G_j
        decay = torch.where(lower[..., None], diff, torch.full_like(diff, -torch.inf)).exp()
        strict = torch.einsum("hid,hjd,hijd->hij", kb[:, c], k[:, c], decay) * (~eye.bool())
        scores = torch.einsum("hid,hjd,hijd->hij", q[:, c], k[:, c], decay)
        inv = _inverse_unit_lower(strict + eye)
        w = inv @ (kb[:, c] * g_c.exp())  # [H, C, dk]
        u = inv @ (v[:, c] * beta[:, c, :, None]) - w @ state
        out[:, c] = q_decayed[:, c] @ state + scores @ u
        state = state * last[:, c, :, None] + k_to_end[:, c].transpose(-1, -2) @ u
    out = out.permute(1, 2, 0, 3).reshape(n * CHUNK, -1, v.shape[-1])
    return out[:length], state
