"""logit_bias on each backend: added to the logits before temperature and filtering (OpenAI), per
row, without touching the reported (raw) logprobs; end to end it decodes as transformers'
SequenceBiasLogitsProcessor does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from tests.conformance.test_sampler_draws import (
    Sampler,
    chi2_p,
    draw_counts,
    row,
    softmax,
)
from tests.conformance.test_scheduling import make_prompts


@pytest.fixture(scope="module")
def sampler(backend) -> Sampler:
    return Sampler(backend)


def test_bias_steers_greedy_rows_and_leaves_unbiased_rows_alone(sampler):
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((5, 3000)) * 3).astype(np.float32)
    low = int(np.argmin(logits[0]))
    best, second = np.argsort(-logits[1])[:2].tolist()
    rows = [
        row(0, temperature=0, logit_bias={low: 100.0}),  # the least likely token wins
        row(1, temperature=0, logit_bias={best: -100.0}),  # the greedy token is excluded
        row(2, temperature=0),
        row(3, temperature=0, logit_bias={low: 0.0}),  # a zero bias changes nothing
        row(4, temperature=0, logit_bias={int(np.argmax(logits[4])): 5.0}),
    ]
    tokens = sampler.sample(logits, rows)
    assert tokens[0] == low and tokens[1] == second
    assert tokens[2:] == np.argmax(logits[2:], axis=-1).tolist()


def test_excluded_tokens_are_never_drawn_and_unbiased_rows_draw_as_alone(sampler):
    rng = np.random.default_rng(6)
    logits = (rng.standard_normal((2, 500)) * 2).astype(np.float32)
    banned = {int(t): -100.0 for t in np.argsort(-logits[0])[:10]}
    for step in range(40):
        rows = [row(11, step, temperature=1.5, logit_bias=banned), row(12, step, temperature=1.5)]
        tokens = sampler.sample(logits, rows)
        assert tokens[0] not in banned
        assert tokens[1] == sampler.sample(logits[1:], rows[1:])[0]


def test_sampled_tokens_follow_softmax_of_biased_logits(sampler):
    logits = np.array([1.0, 0.5, 0.0, -0.5, 0.2, -1.0, 0.7, 0.1])
    bias = {2: 1.5, 6: -2.0, 7: 0.75}
    biased = logits.copy()
    for t, b in bias.items():
        biased[t] += b
    counts = draw_counts(sampler, logits, 2000, 15, temperature=0.9, logit_bias=bias)
    assert chi2_p(counts, softmax(biased / 0.9)) > 1e-4
    assert chi2_p(counts, softmax(logits / 0.9)) < 1e-6  # the bias really moved the distribution
    # Bias is added before temperature: the scaled-bias alternative is rejected too.
    scaled = logits.copy()
    for t, b in bias.items():
        scaled[t] += b * 0.9
    assert chi2_p(counts, softmax(scaled / 0.9)) < 1e-6


def test_reported_logprobs_are_the_unbiased_ones(sampler):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((1, 200)) * 2).astype(np.float32)
    low = int(np.argmin(logits[0]))
    r = row(0, temperature=0, logit_bias={low: 100.0}, logprobs=3)
    out = sampler.mod.sample(sampler.to(logits), [r])
    ref = logits[0] - np.logaddexp.reduce(logits[0].astype(np.float64))
    assert out.token_ids == [low]
    assert out.logprobs[0] == pytest.approx(ref[low], abs=1e-4)
    assert [t for t, _ in out.top_logprobs[0]] == np.argsort(-ref)[:3].tolist()


def test_greedy_decoding_with_bias_matches_transformers(tiny_model_dir, backend):
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir("qwen2")
    llm = LLM(path, backend=backend, dtype="float32", block_size=8, num_kv_blocks=256)
    prompts = make_prompts(llm.tokenizer, 2, seed=21)
    n = 20
    plain = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    free = [o.outputs[0].token_ids for o in llm.generate(prompts, plain)]
    # Exclude the first greedy token, favour a few others moderately: some steps change, not all.
    bias = {free[0][0]: -100.0, free[0][3]: 2.5, 17: 3.0, 42: 1.5}
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logit_bias=bias)
    # Mixed batch: only the first prompt carries the bias.
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, [params, plain])]
    assert got[1] == free[1]
    assert got[0] != free[0] and got[0][0] != free[0][0]

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # never stop early: compare all n tokens
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompts[0]]),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            sequence_bias=[[[t], b] for t, b in bias.items()],
        )
    assert got[0] == ref[0, len(prompts[0]) :].tolist()
    llm.engine.shutdown()
