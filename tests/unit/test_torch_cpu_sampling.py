"""The sampler's native CPU pass (kernels/cpu_sampling.c) against the torch code it replaces, bit for
bit: the Gumbel-max draw's tokens (the same hash, the same logarithm, the same two roundings) and
torch.argmax's rule (the first maximum, NaN counting as the maximum), on ragged widths, one row split
over the threads and many rows, shared and gathered column hashes, with and without temperatures."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from lantern.app.engine.contract import SamplingRow
from lantern.app.engine.sampling_params import SamplingParams
from lantern.backends import sampling_prep
from lantern.backends.sampling_prep import draw_seed
from lantern.backends.torch import sampler

pytestmark = pytest.mark.skipif(not sampler.use_native_cpu_ops(), reason="no native CPU ops on this machine")

CPU = torch.device("cpu")
COLS = [1, 7, 15, 16, 17, 255, 256, 300, 4095, 4096, 5003, 49152, 151936]


def torch_path():
    """Calls made inside `with torch_path():` take the torch code (the reference)."""
    return mock.patch.object(sampler, "_native", False)


def edits(cols: int) -> list:
    """The rows argmax gets wrong most easily: ties, infinities, NaNs (each edits one row in place)."""
    return [
        lambda r: r.fill_(0.0),  # all tied: column 0
        lambda r: r.fill_(-float("inf")),  # all -inf: column 0
        lambda r: r[cols // 2 - 1 :].fill_(100.0),  # tied maxima on both sides of a split: the first
        lambda r: r.__setitem__(-1, 100.0),  # the maximum in the last (ragged) chunk
        lambda r: r.__setitem__(cols // 3, float("nan")),  # NaN counts as the maximum
        lambda r: (r.__setitem__(-1, float("nan")), r.__setitem__(0, float("inf"))),
        lambda r: r[cols // 2 :].fill_(float("nan")),  # the first NaN wins
        lambda r: r.__setitem__(cols - 1 - cols // 4, float("inf")),
    ]


def nasty(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random scores, their first rows edited as `edits` says."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3
    for i, edit in enumerate(edits(cols)[: max(0, rows - 2)]):
        edit(x[i])
    return x


@pytest.mark.parametrize("cols", [4096, 5003, 49152])
def test_one_row_split_over_the_threads_keeps_argmax_rule(cols):
    """One row is split over the threads: the parts' answers must merge as torch.argmax's rule says."""
    for i, edit in enumerate(edits(cols)):
        x = torch.randn(1, cols, generator=torch.Generator().manual_seed(i)) * 3
        edit(x[0])
        assert torch.equal(sampler.row_argmax(x), torch.argmax(x, dim=-1)), i


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", [1, 2, 3, 10])
def test_row_argmax_is_torch_argmax(rows, cols):
    x = nasty(rows, cols, seed=rows * 1000 + cols)
    assert torch.equal(sampler.row_argmax(x), torch.argmax(x, dim=-1))
    assert torch.equal(sampler.row_argmax(x[:, : max(1, cols - 3)]), torch.argmax(x[:, : max(1, cols - 3)], dim=-1))


def keys_for(rows: int, salt: int) -> torch.Tensor:
    return torch.tensor([[draw_seed(salt * 31 + i, i * 7)] for i in range(rows)], dtype=torch.int64)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("temperature", [None, "mixed"])
def test_noisy_argmax_draws_the_torch_tokens(rows, cols, temperature):
    scores = nasty(rows, cols, seed=cols + rows) if rows > 3 else torch.randn(rows, cols) * 2
    keys = keys_for(rows, cols)
    hashes = sampler.column_hashes(cols, CPU)
    temps = None if temperature is None else torch.linspace(0.3, 1.9, rows).reshape(rows, 1)
    got = sampler._argmax_with_noise(scores, keys, hashes, temps)
    with torch_path():
        want = sampler._argmax_with_noise(scores, keys, hashes, temps)
    assert torch.equal(got, want)


def test_the_noisy_scores_are_the_torch_codes_bit_for_bit_over_16m_draws():
    """The values, not only their argmax: 2 x 2^23 hashed columns reach ~86% of the 2^23 values u takes.
    torch's float32 log is MKL's on its x86 builds and Sleef's elsewhere; the two differ by an ulp on
    ~14% of those values, so a kernel with the other one fails here (tokens differ only at near-ties)."""
    cols = 1 << 23
    scores = torch.randn(2, cols, generator=torch.Generator().manual_seed(1)) * 4
    keys = keys_for(2, 77)
    hashes = sampler.column_hashes(cols, CPU)
    keys16 = sampler._xorshift16_int32(keys)
    mix = [sampler._i32(m) for m in (sampling_prep.MIX_C1, sampling_prep.MIX_C2)]
    for temps in (None, torch.tensor([[0.7], [1.3]])):
        got = torch.ops.lantern.noisy_scores(scores, hashes, keys16, torch.empty(0) if temps is None else temps, *mix)
        a, b = sampler._scratch(scores.shape, CPU)
        ng = sampler._neg_gumbel_(a, b, keys16, hashes)
        if temps is not None:
            ng.mul_(temps)
        assert torch.equal(got, torch.sub(scores, ng))


def test_the_fast_pass_noise_is_within_its_bound_for_every_u():
    """The draw's first pass takes a cheap log (kernels/cpu_sampling.c, log_fast) and keeps every column
    within a margin of its maximum for the exact values: the tokens are torch's only if log(-log(u))
    from that log stays within the bound the margin is built on (~2e-5; the margin is 1e-3 * max(T, 1)
    plus a few ulps), for each of the 2^23 values u takes."""
    u = ((torch.arange(1 << 23, dtype=torch.float64) + 0.5) / 2**23).float()
    err = (torch.ops.lantern.fast_neg_gumbel(u).double() - u.log().neg().log().double()).abs()
    assert err.max().item() <= 2e-5


def test_the_candidates_exact_noise_is_torchs_bit_for_bit_for_every_u():
    """The candidates' exact values come from MKL's log on a few values a call (1 to 64 here, in turn):
    they must be the values torch's log gives the whole tensor, for each of the 2^23 values u takes."""
    u = ((torch.arange(1 << 23, dtype=torch.float64) + 0.5) / 2**23).float()
    assert torch.equal(torch.ops.lantern.small_batch_neg_gumbel(u), u.log().neg().log())


@pytest.mark.parametrize("cols", [5, 20, 300])
def test_rows_at_the_bottom_of_the_float_range_draw_the_torch_tokens(cols):
    """A maximum within the margin of -FLT_MAX has no finite floor below it: such rows take the exact pass
    (the fast pass once counted the padding lanes of a short row as candidates, past the row's end)."""
    low = torch.finfo(torch.float32).min
    scores = torch.full((4, cols), low)
    scores[1, cols // 2] = low / 2
    scores[2, -1] = -float("inf")
    scores[3] = torch.linspace(low, low / 1.0001, cols)
    keys, hashes = keys_for(4, cols), sampler.column_hashes(cols, CPU)
    for temps in (None, torch.tensor([[0.5], [1.0], [2.0], [30.0]])):
        got = sampler._argmax_with_noise(scores, keys, hashes, temps)
        with torch_path():
            want = sampler._argmax_with_noise(scores, keys, hashes, temps)
        assert torch.equal(got, want) and bool((got < cols).all())


def exact_noise(keys: torch.Tensor, hashes: torch.Tensor, temps: torch.Tensor | None) -> torch.Tensor:
    """T * log(-log(u)) per row and column, as the torch path makes it."""
    rows, cols = keys.shape[0], hashes.shape[-1]
    a, b = sampler._scratch(torch.Size([rows, cols]), CPU)
    ng = sampler._neg_gumbel_(a, b, sampler._xorshift16_int32(keys), hashes)
    return ng.mul_(temps) if temps is not None else ng


@pytest.mark.parametrize("temperature", [None, "mixed"])
def test_near_ties_of_the_noisy_scores_draw_the_torch_tokens(temperature):
    """Columns whose noisy values tie or differ by an ulp or two (the fast pass cannot tell them apart:
    the exact values must decide, the first column winning a tie), a few or many (more than the
    candidates kept: the row's exact pass), in one chunk or across chunks, at large magnitudes."""
    cols, rows = 49152, 12
    keys, hashes = keys_for(rows, 3), sampler.column_hashes(cols, CPU)
    temps = None if temperature is None else torch.linspace(0.5, 3.0, rows).reshape(rows, 1)
    ng = exact_noise(keys, hashes, temps)
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(rows, cols, generator=gen) * 3 - 40.0
    for r in range(rows):
        many = r % 4 == 3  # 200 tied columns: more candidates than the pass keeps
        picked = torch.randperm(cols, generator=gen)[: 200 if many else 2 + r]
        base = [5.0, 1e4, 3e6][r % 3]
        for i, c in enumerate(picked.tolist()):
            target = torch.tensor(base, dtype=torch.float32)
            for _ in range(i % 3):  # 0, 1 or 2 ulps above the base
                target = torch.nextafter(target, torch.tensor(float("inf")))
            scores[r, c] = target + ng[r, c]  # rounded: scores - noise lands on the base or an ulp off
    got = sampler._argmax_with_noise(scores, keys, hashes, temps)
    with torch_path():
        want = sampler._argmax_with_noise(scores, keys, hashes, temps)
    assert torch.equal(got, want)
    noisy = scores - ng  # the exact values: the winner is a picked column at the top
    assert torch.equal(noisy.gather(1, want.view(-1, 1)).view(-1), noisy.max(dim=1).values)
    for r in range(4):  # a row alone is split over the threads: the parts' candidates, merged
        t = None if temps is None else temps[r : r + 1]
        assert torch.equal(sampler._argmax_with_noise(scores[r : r + 1], keys[r : r + 1], hashes, t), want[r : r + 1])


def test_noisy_argmax_takes_gathered_hashes_and_column_slices():
    """The filtered rows' path: hashes gathered per row ([rows, width]) and a prefix of sorted scores."""
    scores = torch.randn(6, 1000) * 2
    order = torch.argsort(torch.randn(6, 49152), dim=-1)[:, :600]
    hashes = sampler.column_hashes(49152, CPU)[order]
    keys = keys_for(6, 5)
    view = scores[:, :600]  # a slice: rows 1000 apart
    got = sampler._argmax_with_noise(view, keys, hashes)
    with torch_path():
        want = sampler._argmax_with_noise(view, keys, hashes)
    assert torch.equal(got, want)


def test_draws_are_random_and_follow_the_scores():
    """The noise is there (different keys draw different tokens) and the scores count (a large margin wins)."""
    scores = torch.zeros(64, 49152)
    tokens = sampler._argmax_with_noise(scores, keys_for(64, 9), sampler.column_hashes(49152, CPU))
    assert len(set(tokens.tolist())) > 60
    scores[:, 1234] = 50.0
    tokens = sampler._argmax_with_noise(scores, keys_for(64, 9), sampler.column_hashes(49152, CPU))
    assert tokens.tolist() == [1234] * 64


def row(seed: int, step: int, **kw) -> SamplingRow:
    return SamplingRow(params=SamplingParams(max_tokens=None, **kw), seed=seed, step=step)


def test_sample_gives_the_torch_tokens_with_filters_and_greedy_rows():
    filters = [{}, {"top_k": 50}, {"top_p": 0.9}, {"top_k": 200, "top_p": 0.8}, {"min_p": 0.05}]
    logits = torch.randn(16, 49152, generator=torch.Generator().manual_seed(4)) * 3
    rows = [row(100 + i, i, temperature=0.4 + 0.2 * (i % 7), **filters[i % 5]) for i in range(14)]
    rows += [row(1, 1, temperature=0.0), row(2, 2, temperature=0.0)]
    got = sampler.sample(logits, rows).token_ids
    with torch_path():
        want = sampler.sample(logits, rows).token_ids
    assert got == want
    assert got[-2:] == torch.argmax(logits[-2:], dim=-1).tolist()


def test_bad_inputs_raise_instead_of_reading_out_of_bounds():
    scores = torch.randn(2, 100)
    with pytest.raises(ValueError, match="hashes"):
        torch.ops.lantern.noisy_argmax(scores, torch.zeros(99, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                       torch.empty(0), 1, 1)  # fmt: skip
    with pytest.raises(ValueError, match="keys16"):
        torch.ops.lantern.noisy_argmax(scores, torch.zeros(100, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                                       torch.empty(0), 1, 1)  # fmt: skip
    with pytest.raises(ValueError, match="temps"):
        torch.ops.lantern.noisy_argmax(scores, torch.zeros(100, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                       torch.ones(5), 1, 1)  # fmt: skip
    with pytest.raises(ValueError, match="float32"):
        torch.ops.lantern.row_argmax(scores.double())
