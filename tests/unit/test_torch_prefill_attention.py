"""The torch reference prefill attention (backends/torch/kernels/reference.causal_attention) against
attention written out in float64: the plain causal chunk takes SDPA's is_causal with grouped-query
heads read in place, every other case an explicit mask; all must give the same numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lantern.backends.torch.kernels import reference


def _naive(q, k, v, scale, window):
    """q [L, H, D] the last L of S positions; k/v [S, KVH, D]; float64 softmax attention."""
    n_q, h, _ = q.shape
    n_k, kvh, _ = k.shape
    g = h // kvh
    kk = k.double().repeat_interleave(g, dim=1)
    vv = v.double().repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    pos_q = torch.arange(n_k - n_q, n_k)[:, None]
    pos_k = torch.arange(n_k)[None, :]
    allowed = pos_k <= pos_q
    if window is not None:
        allowed &= pos_k > pos_q - window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, vv)


CASES = [  # (n_q, n_k, heads, kv heads, window)
    (37, 37, 9, 3, None),  # plain causal, grouped-query
    (64, 64, 4, 4, None),  # plain causal, one query head per KV head
    (50, 50, 8, 2, 64),  # a window wider than the chunk: still plain causal
    (50, 50, 8, 2, 16),  # a window that cuts in: a mask
    (20, 100, 9, 3, None),  # a chunk after a cached prefix: bottom-right mask
    (20, 100, 8, 2, 30),
]


@pytest.mark.parametrize("n_q,n_k,h,kvh,window", CASES)
def test_causal_attention_matches_float64(n_q, n_k, h, kvh, window):
    g = torch.Generator().manual_seed(n_q * 7 + n_k)
    q, k, v = (torch.randn(n, heads, 64, generator=g) for n, heads in ((n_q, h), (n_k, kvh), (n_k, kvh)))
    got = reference.causal_attention(q, k, v, 0.125, window=window)
    torch.testing.assert_close(got.double(), _naive(q, k, v, 0.125, window), atol=2e-6, rtol=2e-6)


def test_plain_chunk_builds_no_mask(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(reference.F, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(33, 6, 64), torch.randn(33, 2, 64), torch.randn(33, 2, 64)
    masked = reference.sdpa_grouped(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.1,
        reference.causal_mask(33, 33, None, q.device),
    )  # fmt: skip
    plain = reference.causal_attention(q, k, v, 0.1)
    assert calls[-1]["is_causal"] is True and calls[-1].get("attn_mask") is None
    assert calls[-1]["enable_gqa"] is True
    assert torch.equal(plain, masked[0].transpose(0, 1))  # bit-equal to the explicit mask
