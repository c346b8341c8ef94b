"""backends/torch/sampler.py's int32 Gumbel noise against the int64 formula it replaced.

Reference: the draw noise written out in int64 torch arithmetic, exactly as the sampler computed it
before (both lowbias32 multipliers are < 2^31, so a 32-bit value times one stays below 2^63 and is
masked back to 32 bits), and numpy's uint32 reference in backends/sampling_prep.py. The int32 path
must give the same bits, the same float32 noise (torch.equal, not a tolerance) and, through sample(),
the same tokens: with top-k / top-p / min-p, greedy rows, several chunkings and both vocabularies.
The two-level argmax is checked against torch.argmax on ties, -inf, NaN and ragged last blocks.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from lantern.app.engine.contract import SamplingRow
from lantern.app.engine.sampling_params import SamplingParams
from lantern.backends import sampling_prep as prep
from lantern.backends.torch import sampler

CPU = torch.device("cpu")
VOCABS = (49152, 151936)
# The keys at the edges of the int32 wrap (0, 2^31 - 1, 2^31, 2^32 - 1, ...) plus random ones.
EDGE_KEYS = [0, 1, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1]


def keys_column(n_random: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    keys = EDGE_KEYS + [int(k) for k in rng.integers(0, 2**32, n_random)]
    return torch.tensor(keys, dtype=torch.int64)[:, None]


def mix32_int64(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * prep.MIX_C1) & prep.M32
    x = x ^ (x >> 15)
    x = (x * prep.MIX_C2) & prep.M32
    return x ^ (x >> 15)


def column_mix_int64(vocab: int) -> torch.Tensor:
    return mix32_int64(torch.arange(vocab, dtype=torch.int64))


def neg_gumbel_int64(keys: torch.Tensor, cols_mix: torch.Tensor) -> torch.Tensor:
    u = ((mix32_int64(cols_mix ^ keys) >> 9).to(torch.float32) + 0.5) * 2.0**-23
    return torch.log(-torch.log(u))


def argmax_int64(
    scores: torch.Tensor, keys: torch.Tensor, cols_mix: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    ng = neg_gumbel_int64(keys, cols_mix)
    if temperature is not None:
        ng = ng * temperature
    return torch.argmax(scores - ng, dim=-1)


@pytest.mark.parametrize("vocab", VOCABS)
def test_noise_bits_and_gumbel_equal_the_int64_formula_on_every_column(vocab):
    keys = keys_column(24)
    cols_mix = column_mix_int64(vocab)
    hashes = sampler.column_hashes(vocab, CPU)
    assert hashes.dtype == torch.int32 and hashes.shape == (vocab,)
    ref = mix32_int64(cols_mix ^ keys)
    bits = sampler.noise_bits(keys, hashes)
    assert bits.dtype == torch.int64 and torch.equal(bits, ref)
    assert np.array_equal(bits.numpy(), prep.noise_bits(keys.numpy(), np.arange(vocab)).astype(np.int64))
    assert torch.equal(sampler.gumbel_noise(keys, hashes), -neg_gumbel_int64(keys, cols_mix))


def test_gathered_column_hashes_give_the_same_bits():
    # The top-k / top-p path hashes a per-row gather of the columns: hashes[order], [R, keep].
    vocab = 49152
    keys = keys_column(8, seed=1)
    order = torch.stack([torch.randperm(vocab, generator=torch.Generator().manual_seed(i))[:3000] for i in range(16)])
    bits = sampler.noise_bits(keys, sampler.column_hashes(vocab, CPU)[order])
    assert torch.equal(bits, mix32_int64(column_mix_int64(vocab)[order] ^ keys))


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("chunk", [None, 1 << 14, 3 * 49152 + 5])
def test_argmax_with_noise_picks_the_int64_tokens(vocab, chunk, monkeypatch):
    if chunk is not None:  # one row per chunk, or a ragged last chunk of rows
        monkeypatch.setitem(sampler._NOISE_ELEMS, "cpu", chunk)
    gen = torch.Generator().manual_seed(vocab)
    keys = keys_column(24, seed=2)
    scores = torch.randn(len(keys), vocab, generator=gen) * 3
    scores[3, ::2] = -float("inf")  # a masked row
    scores[5, :] = 0.0  # a flat row: the noise alone decides
    cols_mix, hashes = column_mix_int64(vocab), sampler.column_hashes(vocab, CPU)
    for t in (None, 0.5, 1.0, 1.7):
        temps = None if t is None else torch.full((len(keys), 1), t)
        got = sampler._argmax_with_noise(scores, keys, hashes, temps)
        assert torch.equal(got, argmax_int64(scores, keys, cols_mix, temps)), t


def row(seed: int, step: int, **kw) -> SamplingRow:
    return SamplingRow(params=SamplingParams(max_tokens=None, **kw), seed=seed, step=step)


FILTERS = [{}, {"top_k": 50}, {"top_p": 0.9}, {"top_k": 200, "top_p": 0.8}, {"min_p": 0.05}]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_sample_draws_the_same_tokens_as_the_int64_sampler(vocab, temperature, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    n = 16
    logits = torch.randn(n, vocab, generator=gen) * 1.5
    rows = [row(1000 * i - 5, i * 37, temperature=temperature, **FILTERS[i % len(FILTERS)]) for i in range(n - 1)]
    rows.append(row(3, 1, temperature=0.0))  # a greedy row in the batch
    no_filter = [row(r.seed, r.step, temperature=temperature) for r in rows]
    got = [sampler.sample(logits, rs).token_ids for rs in (rows, no_filter)]
    # The same sample() with the int64 noise it used before.
    monkeypatch.setattr(sampler, "column_hashes", lambda v, dev: column_mix_int64(v).to(dev))
    monkeypatch.setattr(sampler, "_argmax_with_noise", argmax_int64)
    want = [sampler.sample(logits, rs).token_ids for rs in (rows, no_filter)]
    assert got == want
    greedy = torch.argmax(logits, dim=-1).tolist()
    assert got[0][-1] == greedy[-1]
    assert sum(a != b for a, b in zip(got[1], greedy, strict=True)) >= 4  # the draws are random


@pytest.mark.parametrize("cols", [1, 7, 64, 255, 256, 300, 1000, 5003, 49152, 50257, 151936])
def test_row_argmax_is_torch_argmax(cols):
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(12, cols, generator=gen)
    x[1] = 0.0  # all tied: column 0
    x[2] = -float("inf")  # all -inf: column 0
    x[3, cols // 2 :] = 100.0  # tied maxima across blocks: the first one
    x[4, -1] = 100.0  # the maximum in the last (possibly partial) block
    x[5, -1], x[5, 0] = 100.0, 100.0  # a tie between the first block and the last column
    x[6, cols // 3] = float("nan")  # NaN counts as the maximum
    x[7, -1] = float("nan")
    x[8, cols // 2] = float("nan")
    x[8, -1] = float("nan")  # the first NaN wins
    x[9, cols // 3 :] = float("nan")
    x[9, 0] = float("inf")
    x[10, cols - cols % 64 - 1 if cols > 64 else 0] = 50.0  # just before a ragged tail
    x[10, -1] = 50.0
    got = sampler.row_argmax(x)
    assert torch.equal(got, torch.argmax(x, dim=-1))


@pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="mlx not installed")
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_torch_and_mlx_draw_the_same_tokens_at_a_real_vocabulary(temperature):
    import mlx.core as mx

    from lantern.backends.mlx import sampler as mlx_sampler

    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((12, 49152)) * 3).astype(np.float32)
    rows = [row(77 + i, i, temperature=temperature, **FILTERS[i % len(FILTERS)]) for i in range(12)]
    got = sampler.sample(torch.from_numpy(logits), rows).token_ids
    assert got == mlx_sampler.sample(mx.array(logits), rows).token_ids
