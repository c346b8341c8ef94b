"""The samplers' random draws, called directly on each backend: the on-device hash noise equals the
numpy reference, a row draws the same token alone or in a batch, and the draws follow
softmax(logits / T) (after top-k / top-p) by a chi-square test with the power to reject a slightly
wrong distribution. Steps and seeds give independent draws.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from scipy import stats

from lantern.app.engine.contract import SamplingRow
from lantern.app.engine.sampling_params import SamplingParams
from lantern.backends import sampling_prep as prep

P_MIN = 1e-4  # deterministic draws: a correct sampler passes at any threshold this small


class Sampler:
    """One backend's sample() and noise functions behind numpy in, lists out."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        if backend == "mlx":
            import mlx.core as mx

            from lantern.backends.mlx import sampler

            self.to = mx.array
            self.back = np.array
            self.keys = lambda k: mx.array(k.astype(np.uint32))
            self.hashes = sampler.column_hashes
        else:
            import torch

            from lantern.backends.torch import sampler

            dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.to = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dev)
            self.back = lambda t: t.cpu().numpy()
            self.keys = self.to
            self.hashes = lambda v: sampler.column_hashes(v, dev)
        self.mod = sampler

    def sample(self, logits: np.ndarray, rows: list[SamplingRow]) -> list[int]:
        return self.mod.sample(self.to(logits.astype(np.float32)), rows).token_ids

    def bits(self, keys: np.ndarray, vocab: int) -> np.ndarray:
        return self.back(self.mod.noise_bits(self.keys(keys), self.hashes(vocab))).astype(np.int64)

    def gumbel(self, keys: np.ndarray, vocab: int) -> np.ndarray:
        return self.back(self.mod.gumbel_noise(self.keys(keys), self.hashes(vocab)))


@pytest.fixture(scope="module")
def sampler(backend) -> Sampler:
    return Sampler(backend)


def row(seed: int, step: int = 0, **kw) -> SamplingRow:
    return SamplingRow(params=SamplingParams(max_tokens=None, **kw), seed=seed, step=step)


def draw_counts(sampler: Sampler, logits: np.ndarray, n_rows: int, steps: int, **kw) -> np.ndarray:
    """Counts of the tokens drawn by n_rows seeds x `steps` steps from the same logits."""
    batch = np.repeat(logits[None, :], n_rows, axis=0)
    counts = np.zeros(len(logits), np.int64)
    for step in range(steps):
        toks = sampler.sample(batch, [row(s, step, **kw) for s in range(n_rows)])
        counts += np.bincount(toks, minlength=len(logits))
    return counts


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "drew a token whose probability is 0"
    expected = probs[keep] * counts.sum()
    return float(stats.chisquare(counts[keep], expected).pvalue)


def test_noise_is_the_reference_hash_bit_for_bit(sampler):
    seeds = [(0, 0), (0, 1), (1, 0), (-7, 3), (2**63 - 1, 10**6), (123456789, 2**31)]
    keys = np.array([[prep.draw_seed(s, t)] for s, t in seeds], np.int64)
    vocab = 70000
    ref_bits = prep.noise_bits(keys, np.arange(vocab)).astype(np.int64)
    assert np.array_equal(sampler.bits(keys, vocab), ref_bits)
    g = sampler.gumbel(keys, vocab)
    assert np.allclose(g, prep.gumbel_noise(keys, np.arange(vocab)), rtol=1e-5, atol=1e-5)
    assert np.isfinite(g).all()
    # Gumbel(0, 1): mean = Euler's gamma, variance = pi^2 / 6.
    assert abs(g.mean() - np.euler_gamma) < 0.01 and abs(g.var() - np.pi**2 / 6) < 0.02


@pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None or importlib.util.find_spec("torch") is None, reason="needs both backends"
)
def test_torch_and_mlx_draw_the_same_tokens():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((16, 5000)) * 2).astype(np.float32)
    rows = [
        row(1000 + i, 7 + i, temperature=0.5 + 0.1 * i, top_p=0.9 if i % 3 == 0 else 1.0, top_k=50 if i % 4 == 1 else 0)
        for i in range(16)
    ]
    assert Sampler("torch").sample(logits, rows) == Sampler("mlx").sample(logits, rows)


def test_a_row_draws_the_same_token_alone_and_in_a_batch_of_32(sampler):
    rng = np.random.default_rng(4)
    vocab = 32000
    logits = (rng.standard_normal((32, vocab)) * 3).astype(np.float32)
    variants = [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 40},
        {"temperature": 0.9, "min_p": 0.05},
        {"temperature": 0.0},
        {"temperature": 2.0, "top_k": 5, "top_p": 0.5},
        {"temperature": 1.0, "logit_bias": {7: 4.0, 9: -100.0}},
    ]
    rows = [
        row(rng.integers(-(2**40), 2**40), int(rng.integers(0, 500)), **variants[i % len(variants)]) for i in range(32)
    ]
    batched = sampler.sample(logits, rows)
    alone = [sampler.sample(logits[i : i + 1], [r])[0] for i, r in enumerate(rows)]
    assert batched == alone
    # The same draw key in another row position still gives that row's token.
    perm = rng.permutation(32)
    assert sampler.sample(logits[perm], [rows[i] for i in perm]) == [batched[i] for i in perm]
    # Another step of the same seeds draws differently (for the sampled rows).
    later = sampler.sample(logits, [SamplingRow(params=r.params, seed=r.seed, step=r.step + 1) for r in rows])
    assert sum(a != b for a, b in zip(batched, later, strict=True)) >= 16


def test_draws_follow_softmax_of_logits_over_temperature(sampler):
    logits = np.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.3])
    counts = draw_counts(sampler, logits, 2000, 20, temperature=0.8)  # 40k draws
    assert chi2_p(counts, softmax(logits / 0.8)) > P_MIN
    assert np.abs(counts / counts.sum() - softmax(logits / 0.8)).max() < 0.01
    # Power: the same draws reject a temperature only 0.05 off, and a one-nat shift of one logit.
    assert chi2_p(counts, softmax(logits / 0.85)) < 1e-6
    shifted = logits.copy()
    shifted[6] += 1.0
    assert chi2_p(counts, softmax(shifted / 0.8)) < 1e-6


def test_top_k_and_top_p_draws_follow_the_renormalized_distribution(sampler):
    logits = np.array([1.5, 1.2, 1.0, 0.2, -0.3, -1.0, 0.8, 0.0])
    p = softmax(logits)
    top3 = np.where(p >= np.sort(p)[-3], p, 0.0)
    counts = draw_counts(sampler, logits, 1500, 20, temperature=1.0, top_k=3)
    assert chi2_p(counts, top3 / top3.sum()) > P_MIN
    # top_p = 0.6: the fewest most likely tokens whose mass reaches 0.6.
    order = np.argsort(-p)
    n_keep = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)
    nucleus = np.zeros_like(p)
    nucleus[order[:n_keep]] = p[order[:n_keep]]
    assert 1 < n_keep < len(p)
    counts = draw_counts(sampler, logits, 1500, 20, temperature=1.0, top_p=0.6)
    assert chi2_p(counts, nucleus / nucleus.sum()) > P_MIN


def test_draws_cover_a_large_vocabulary_uniformly(sampler):
    vocab = 1024
    counts = draw_counts(sampler, np.zeros(vocab), 512, 40)  # 20 draws per token expected
    assert chi2_p(counts, np.full(vocab, 1.0 / vocab)) > P_MIN


def test_consecutive_steps_and_neighbouring_seeds_are_independent(sampler):
    # n > 1 fans out to seeds s, s+1, ...; a sequence draws at steps t, t+1, ...
    vocab, n = 4, 6000
    logits = np.zeros((n, vocab), np.float32)
    step0 = np.array(sampler.sample(logits, [row(s, 0) for s in range(n)]))
    step1 = np.array(sampler.sample(logits, [row(s, 1) for s in range(n)]))
    for a, b in ((step0, step1), (step0[:-1], step0[1:])):
        table = np.zeros((vocab, vocab), np.int64)
        np.add.at(table, (a, b), 1)
        assert stats.chi2_contingency(table).pvalue > P_MIN
        assert (a != b).mean() == pytest.approx(0.75, abs=0.03)


def test_a_filtered_draw_over_every_column_takes_the_same_tokens(sampler, monkeypatch):
    """On a GPU a top-k / top-p / min-p draw does not read back how many columns survive (that would make the host
    wait for the step): it draws over all of them, the dropped ones at -inf. Same tokens as over the survivors only
    (a CPU's way), for every filter, mixed with unfiltered rows, a row whose only survivor is its first column."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(12, 300)) * 3
    logits[7, 3] = 40.0  # (top_p 0.5: one column survives)
    filters = [{"top_k": 5}, {"top_p": 0.7}, {"min_p": 0.2}, {"top_k": 40, "top_p": 0.9}, {}, {"top_p": 0.5}]
    rows = [row(s, s % 3, temperature=[1.0, 0.7][s % 2], **filters[s % len(filters)]) for s in range(12)]
    cut = sampler.sample(logits, rows)
    monkeypatch.setattr(sampler.mod, "_cut_to_survivors", lambda *a: False)
    assert sampler.sample(logits, rows) == cut
    monkeypatch.setattr(sampler.mod, "_cut_to_survivors", lambda *a: True)
    assert sampler.sample(logits, rows) == cut and len(set(cut)) > 6
