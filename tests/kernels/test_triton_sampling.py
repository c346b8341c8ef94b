"""The one-kernel Gumbel-max draw (CUDA's) against the sampler's torch ops, which define the draw.

On CPU the kernel runs in Triton's interpreter; the gpu case checks CUDA's build (libdevice's logf, no FMA) against
torch's CUDA ops token for token.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernel runs on CPU

import pytest

from lantern.backends.torch import sampler

ts = pytest.importorskip("lantern.backends.torch.kernels.triton_sampling")


def torch_draw(scores, keys, hashes, temperature=None):
    """sampler's ops, spelled out: argmax(scores - T * log(-log(u))) (first maximum, NaN counting as one)."""
    neg_gumbel = -sampler.gumbel_noise(keys, hashes)
    if temperature is not None:
        neg_gumbel = neg_gumbel * temperature
    return torch.argmax(scores - neg_gumbel, dim=-1)


def draw_case(rows, cols, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    scores = (3 * torch.randn(rows, cols, generator=g)).to(device)
    keys = torch.randint(0, 2**32, (rows, 1), generator=g, dtype=torch.int64).to(device)
    return scores, keys, sampler.column_hashes(cols, torch.device(device))


@pytest.mark.parametrize(
    "rows,cols",
    [(1, 49152), (1, 37), (3, 5000), (5, 2048), (300, 64)],  # one part; several (a ragged last); many rows
)
def test_the_kernel_draws_the_tokens_the_ops_draw(rows, cols):
    """Random scores and keys, T = 1 and per-row temperatures: the same token as the ops in every row (over 300
    rows: the noise decides, not the scores -- a wrong hash would be caught)."""
    scores, keys, hashes = draw_case(rows, cols, seed=rows * cols)
    got = ts.noisy_argmax(scores, keys, hashes, None)
    assert got.dtype == torch.int64 and torch.equal(got, torch_draw(scores, keys, hashes))
    temps = torch.rand(rows, 1, generator=torch.Generator().manual_seed(1)) * 2 + 0.05
    got_t = ts.noisy_argmax(scores, keys, hashes, temps)
    assert torch.equal(got_t, torch_draw(scores, keys, hashes, temps))
    if rows == 300:  # flat scores: the noise alone picks, spread over the columns
        flat = torch.zeros(rows, cols)
        picks = ts.noisy_argmax(flat, keys, hashes, None)
        assert torch.equal(picks, torch_draw(flat, keys, hashes)) and len(set(picks.tolist())) > cols // 2


def test_nan_inf_and_filtered_rows():
    """A NaN wins at its first column (torch.argmax's rule), in a later part than a +inf; an all -inf row gives
    column 0; per-row hashes (the filtered rows' gathered columns) are read per row."""
    scores, keys, hashes = draw_case(3, 3000, seed=7)
    scores[0, 100] = float("inf")
    scores[0, 2500] = float("nan")
    scores[0, 2900] = float("nan")
    scores[1] = float("-inf")
    got = ts.noisy_argmax(scores, keys, hashes, None)
    assert got.tolist()[:2] == [2500, 0]
    assert got[2] == torch_draw(scores[2:], keys[2:], hashes)[0]
    order = torch.stack([torch.randperm(3000, generator=torch.Generator().manual_seed(r))[:40] for r in range(3)])
    gathered = hashes[order]  # [3, 40]: each row's own columns
    sub = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    assert torch.equal(ts.noisy_argmax(sub, keys, gathered, None), torch_draw(sub, keys, gathered))


def test_the_sampler_takes_the_kernel_on_cuda_tensors(monkeypatch):
    """_argmax_with_noise routes CUDA rows to the kernel (here: CPU tensors told they are CUDA's), and the counters
    it folds with are left at zero."""
    from lantern.backends.torch.kernels import ops, triton_kernels

    scores, keys, hashes = draw_case(2, 4096, seed=11)
    calls = []
    real = ts.noisy_argmax
    monkeypatch.setattr(ts, "noisy_argmax", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(ops, "use_triton", lambda t: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    got = sampler._argmax_with_noise(scores, keys, hashes, None)
    monkeypatch.undo()
    assert calls == [1] and torch.equal(got, torch_draw(scores, keys, hashes))
    assert not triton_kernels.fold_counters(torch.device("cpu"), 2).any()


@pytest.mark.gpu
def test_cuda_draws_match_torch_ops_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for rows, cols in [(1, 128256), (8, 151936), (64, 32000)]:
        scores, keys, hashes = draw_case(rows, cols, seed=rows, device="cuda")
        temps = (torch.rand(rows, 1) * 1.5 + 0.1).cuda()
        for t in (None, temps):
            want = torch_draw(scores, keys, hashes, t)
            assert torch.equal(ts.noisy_argmax(scores, keys, hashes, t), want)


@pytest.mark.parametrize("temperatures", [(1.0, 1.0, 1.0, 1.0), (0.5, 1.0, 1.7, 0.9)])
def test_sample_draws_on_cuda_as_on_the_cpu(temperatures, monkeypatch):
    """sampler.sample on rows without filters, told its logits are CUDA's: the keys (and temperatures unless all are
    1) go over as one float64 upload into the kernel, and the tokens are the CPU path's, row for row."""
    from lantern.app.engine.contract import SamplingRow
    from lantern.app.engine.sampling_params import SamplingParams
    from lantern.backends.torch.kernels import ops

    logits = 3 * torch.randn(len(temperatures), 3000, generator=torch.Generator().manual_seed(5))
    rows = [
        SamplingRow(params=SamplingParams(max_tokens=None, temperature=t), seed=40 + i, step=i)
        for i, t in enumerate(temperatures)
    ]
    want = sampler.sample(logits, rows).token_ids
    uploads, draws = [], []
    real_draw, real_rows = ts.noisy_argmax, sampler._triton_draw_rows
    monkeypatch.setattr(ts, "noisy_argmax", lambda *a: draws.append(a) or real_draw(*a))
    monkeypatch.setattr(sampler, "_triton_draw_rows", lambda *a: uploads.append(a) or real_rows(*a))
    monkeypatch.setattr(ops, "use_triton", lambda t: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    got = sampler.sample(logits, rows).token_ids
    monkeypatch.undo()
    assert got == want and len(uploads) == 1 and len(draws) == 1
    keys, temps = draws[0][1], draws[0][3]
    assert keys.dtype == torch.float64 and (temps is None) == (set(temperatures) == {1.0})
